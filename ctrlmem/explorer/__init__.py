"""The JupyterLab explorer: settings and views as plain functions, the widgets, and the background builder.
"""
