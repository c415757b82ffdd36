"""Experiment configs: the YAML form, its validation (errors name the file, key and fix) and the
points a config defines."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ctrlmem.util.checks import short_repr
import stat


DEFAULT_NOTEBOOK = "notebooks/10_experiment.ipynb"
"""The notebook a config runs when it names none, relative to the root (the current directory)."""

CONFIRM_POINTS = 1000
"""A sweep with more points than this runs only with ``--yes`` (``yes=True``)."""

MAX_POINTS = 100_000
"""A config defining more points than this is refused (with or without ``--yes``): the count is
computed from the lengths of ``cases`` and ``grid`` before any point is listed. Split the sweep."""

MAX_CONFIG_VALUES = 200_000
"""Most values (mappings, lists and scalars, counting every use of a YAML alias) a config may
expand to; a few hundred bytes of nested aliases expand to billions ("billion laughs")."""

MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""Largest ``timeout_s`` of one run (30 days)."""

MAX_CONFIG_BYTES = 4 << 20
"""Largest config file read (4 MiB)."""


def resolve_root(root: str | Path | None) -> Path:
    """The folder relative paths mean: ``root`` if given, else the current directory. The library
    never locates itself: a config's notebook and the default results/build folders are found
    from here."""
    base = Path.cwd() if root is None else Path(root)
    if root is not None and not base.is_dir():
        raise ConfigError(f"--root {root}: {'is not a folder' if base.exists() else 'no such folder'}; "
                          f"give the folder that holds notebooks/ and experiments/")
    return base.absolute()


_TOP_KEYS = {
    "name": "a short slug naming the experiment, e.g. table4-cpu",
    "description": "one sentence: what the sweep reproduces",
    "paper": "the paper artifact it reproduces, e.g. 'Table 4 / Fig. 6'",
    "scale": "'paper' (A100 numbers from the cost model) or 'cpu' (runs here)",
    "counterpart": "name of the config at the other scale",
    "notebook": f"notebook path, relative to the current directory or --root (default {DEFAULT_NOTEBOOK})",
    "timeout_s": "per-run timeout in seconds (default 600)",
    "params": "mapping of notebook parameters shared by every run",
    "cases": "list of mappings (each one group of parameters), or a mapping of group -> list (their product)",
    "grid": "mapping of parameter -> list of values (cartesian product)",
    "launcher": "'local' (default: this machine) or 'slurm' (one sbatch job per real-run point)",
    "slurm": "Slurm launcher options: partition, account, time_limit, nodes, poll_s",
}

# --- Slurm launcher hook (see ctrlmem/experiments/slurm.py) ---
LAUNCHERS = ("local", "slurm")
SLURM_KEYS = {"partition": str, "account": str, "time_limit": str, "nodes": int, "poll_s": (int, float)}


def _check_launcher(where: str, data: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    launcher = data.get("launcher", "local")
    if not isinstance(launcher, str) or launcher not in LAUNCHERS:
        raise ConfigError(f"{where}: key 'launcher' must be one of {list(LAUNCHERS)}, got {short_repr(launcher)}")
    options = data.get("slurm") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: key 'slurm' must be a mapping of {sorted(SLURM_KEYS)}, got {short_repr(options)}")
    for k, v in options.items():
        if k not in SLURM_KEYS:
            raise ConfigError(f"{where}: unknown key 'slurm.{str(k)[:40]}'; allowed: {', '.join(sorted(SLURM_KEYS))}")
        if isinstance(v, bool) or not isinstance(v, SLURM_KEYS[k]):
            raise ConfigError(f"{where}: key 'slurm.{k}' has the wrong type ({short_repr(v)})")
        if k in ("nodes", "poll_s") and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{where}: key 'slurm.{k}' must be a positive number, got {v!r}")
    return launcher, dict(options)
# --- end of the Slurm launcher hook ---


_REQUIRED = ("name", "description", "scale")


_SCALES = ("paper", "cpu")


_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ConfigError(ValueError):
    """A bad experiment config; the message names the file, the key and the fix (at most
    :data:`MAX_MESSAGE` characters: a huge input is never repeated in full)."""

    MAX_MESSAGE = 1000

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        if len(text) > self.MAX_MESSAGE:
            text = text[: self.MAX_MESSAGE - 15] + " ... (cut short)"
        super().__init__(text, *args)


@dataclass(frozen=True)
class Run:
    """One point of a sweep: its id and the notebook parameters."""

    run_id: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment config (see the module docstring for the YAML form).

    Args:
        path: the YAML file it was read from (``None`` when built in code).
        name: slug naming the experiment; results go under ``experiments/results/<name>/``.
        description: what it reproduces.
        scale: ``"paper"`` or ``"cpu"``.
        notebook: the notebook to execute, absolute.
        timeout_s: per-run timeout in seconds.
        params, cases, grid: the point specification.
        paper: the paper artifact, free text.
        counterpart: the config at the other scale.
        launcher: where real-run points run: "local" or "slurm" (:mod:`ctrlmem.experiments.slurm`).
        slurm: Slurm launcher options (partition, account, time_limit, nodes, poll_s).
    """

    path: Path | None
    name: str
    description: str
    scale: str
    notebook: Path
    timeout_s: float
    params: Mapping[str, Any]
    cases: tuple[Mapping[str, Any], ...]
    grid: Mapping[str, tuple[Any, ...]]
    paper: str = ""
    counterpart: str = ""
    launcher: str = "local"
    slurm: Mapping[str, Any] | None = None

    def runs(self) -> list[Run]:
        return plan_runs(self)

    @property
    def num_points(self) -> int:
        """How many points the config defines (computed without listing them)."""
        return _count_points(self.cases, self.grid)


def _count_points(cases, grid) -> int:
    n = max(1, len(cases))
    for values in grid.values():
        n *= len(values)
    return n


def _where(path: Path | str | None) -> str:
    return str(path) if path is not None else "<config>"


def _check_literal(where: str, key: str, value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ConfigError(f"{where}: key {key!r} is {value!r}; give a finite number")
        return value
    raise ConfigError(
        f"{where}: key {key!r} holds a {type(value).__name__} ({short_repr(value)}); notebook parameters must be "
        f"literals (string, number, bool or null) — write lists under 'grid' instead"
    )


def _check_mapping(where: str, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: key {key!r} must be a mapping of parameter: value, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{where}: key {key}.{short_repr(k, 40)} is not a valid parameter name (a Python identifier)")
        out[k] = _check_literal(where, f"{key}.{k}", v)
    return out


def _check_expanded_size(where: str, data: Any) -> int:
    """How many values ``data`` holds when every shared part (a YAML alias) is counted at each use;
    ``ConfigError`` above :data:`MAX_CONFIG_VALUES` or for a part that contains itself. Computed
    over the shared structure (each part once), never by expanding it."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (Mapping, list, tuple)):
            continue
        key = id(node)
        if done:
            children = list(node.keys()) + list(node.values()) if isinstance(node, Mapping) else list(node)
            total = 1 + sum(sizes.get(id(c), 1) for c in children)
            sizes[key] = total
            on_path.discard(key)
            if total > MAX_CONFIG_VALUES:
                raise ConfigError(f"{where}: the config expands to more than {MAX_CONFIG_VALUES:,} values (nested "
                                  f"YAML aliases, '*name', repeat parts of it); write the points out, or use "
                                  f"'grid' for products")
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ConfigError(f"{where}: the config contains itself (a YAML alias refers to the mapping or list it "
                              f"is in); remove the recursive alias")
        on_path.add(key)
        stack.append((node, True))
        children = list(node.values()) if isinstance(node, Mapping) else list(node)
        stack.extend((c, False) for c in children if isinstance(c, (Mapping, list, tuple)))
    return sizes.get(id(data), 1)


def check_notebook(notebook: Path, where: str, given: str) -> None:
    """``ConfigError`` unless ``notebook`` is a Jupyter notebook file (never prints its content)."""
    if not notebook.exists():
        raise ConfigError(f"{where}: key 'notebook': {short_repr(given)} does not exist (looked at {notebook}); give a path "
                          f"relative to the current directory (or to --root), or an absolute one")
    if not notebook.is_file():
        raise ConfigError(f"{where}: key 'notebook': {notebook} is a folder; give the .ipynb file")
    if notebook.suffix != ".ipynb":
        raise ConfigError(f"{where}: key 'notebook': {notebook} is not a Jupyter notebook (expected a .ipynb file)")
    try:
        with open(notebook, "rb") as fh:
            nb = json.loads(fh.read(64 << 20).decode("utf-8"))
    except (OSError, ValueError):
        nb = None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or "nbformat" not in nb:
        raise ConfigError(f"{where}: key 'notebook': {notebook} is not a Jupyter notebook (no nbformat JSON with "
                          f"cells); give a .ipynb saved by Jupyter")


def config_from_dict(data: Any, path: Path | str | None = None, root: str | Path | None = None) -> ExperimentConfig:
    """Validate a parsed config mapping; ``ConfigError`` names the file, key and fix.

    A relative ``notebook`` is relative to ``root`` (default: the current directory)."""
    where = _where(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: the file must hold a YAML mapping (name:, description:, ...), "
                          f"got {type(data).__name__}")
    _check_expanded_size(where, data)
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in _TOP_KEYS.items())
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed keys — {allowed}")
    for key in _REQUIRED:
        if key not in data:
            raise ConfigError(f"{where}: missing required key {key!r} ({_TOP_KEYS[key]})")
    name = data["name"]
    if not isinstance(name, str) or not _SLUG.match(name):
        raise ConfigError(f"{where}: key 'name' must be a lower-case slug like 'table4-cpu', got {short_repr(name)}")
    if not isinstance(data["description"], str) or not data["description"].strip():
        raise ConfigError(f"{where}: key 'description' must be a non-empty string")
    scale = data["scale"]
    if scale not in _SCALES:
        raise ConfigError(f"{where}: key 'scale' must be one of {list(_SCALES)}, got {short_repr(scale)}")
    timeout = data.get("timeout_s", 600)
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
            or not math.isfinite(timeout) or timeout > MAX_TIMEOUT_S):
        raise ConfigError(f"{where}: key 'timeout_s' must be a positive number of seconds (at most {MAX_TIMEOUT_S:g}), got {short_repr(timeout)}")
    nb_rel = data.get("notebook", DEFAULT_NOTEBOOK)
    if not isinstance(nb_rel, str):
        raise ConfigError(f"{where}: key 'notebook' must be a path string, got {short_repr(nb_rel)}")
    notebook = Path(nb_rel).expanduser()
    if not notebook.is_absolute():
        notebook = resolve_root(root) / notebook
    check_notebook(notebook, where, nb_rel)
    params = _check_mapping(where, "params", data.get("params") or {})
    for key, kind in (("cases", "a list of mappings"), ("grid", "a mapping of parameter: [values]")):
        if key in data and data[key] is not None and not data[key] and isinstance(data[key], (list, Mapping)):
            raise ConfigError(f"{where}: key {key!r} is empty ({data[key]!r}), so the sweep would run only the "
                              f"notebook's defaults; give {kind}, or remove the key")
    raw_grid = data.get("grid") or {}
    if not isinstance(raw_grid, Mapping):
        raise ConfigError(f"{where}: key 'grid' must be a mapping of parameter: [values], got {type(raw_grid).__name__}")
    for k, values in raw_grid.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{where}: key grid.{short_repr(k, 40)} is not a valid parameter name")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: key 'grid.{k}' must be a non-empty list of values, got {short_repr(values)}; "
                              f"put a single value under 'params' instead")
    grid_points = math.prod(len(v) for v in raw_grid.values())
    raw_cases = data.get("cases") or []
    if isinstance(raw_cases, Mapping):
        for gname, group in raw_cases.items():
            if not isinstance(group, list) or not group:
                raise ConfigError(f"{where}: key 'cases.{short_repr(gname, 40)}' must be a non-empty list of mappings")
        case_points = math.prod(len(g) for g in raw_cases.values())
    elif isinstance(raw_cases, list):
        case_points = max(1, len(raw_cases))
    else:
        raise ConfigError(f"{where}: key 'cases' must be a list of mappings, or a mapping of group name -> list "
                          f"of mappings (product of the groups), got {type(raw_cases).__name__}")
    total = case_points * grid_points  # counted before anything is listed
    if total > MAX_POINTS:
        raise ConfigError(f"{where}: the config defines {total:,} points (cases x grid), more than the {MAX_POINTS:,} a "
                          f"sweep takes (ctrlmem.experiments.MAX_POINTS); split it into several configs or shorten "
                          f"the lists")
    if isinstance(raw_cases, Mapping):
        groups = [[_check_mapping(where, f"cases.{gname}[{i}]", c) for i, c in enumerate(group)]
                  for gname, group in raw_cases.items()]
        cases = tuple({k: v for part in combo for k, v in part.items()} for combo in itertools.product(*groups))
    else:
        cases = tuple(_check_mapping(where, f"cases[{i}]", c) for i, c in enumerate(raw_cases))
    for key_path, mapping in [("params", params), *((f"cases[{i}]", c) for i, c in enumerate(cases))]:
        if "out_dir" in mapping:
            raise ConfigError(f"{where}: key '{key_path}.out_dir' is set by the sweep runner; remove it "
                              f"(use `ctrlmem sweep --build DIR`)")
    grid: dict[str, tuple[Any, ...]] = {
        k: tuple(_check_literal(where, f"grid.{k}[{i}]", v) for i, v in enumerate(values))
        for k, values in raw_grid.items()}
    for text_key in ("paper", "counterpart"):
        if text_key in data and not isinstance(data[text_key], str):
            raise ConfigError(f"{where}: key {text_key!r} must be a string, got {short_repr(data[text_key])}")
    launcher, slurm_options = _check_launcher(where, data)
    config = ExperimentConfig(
        path=Path(path) if path is not None else None,
        name=name,
        description=data["description"].strip(),
        scale=scale,
        notebook=notebook,
        timeout_s=float(timeout),
        params=params,
        cases=cases,
        grid=grid,
        paper=data.get("paper", ""),
        counterpart=data.get("counterpart", ""),
        launcher=launcher,
        slurm=slurm_options,
    )
    if not params and not cases and not grid:
        raise ConfigError(f"{where}: the config defines no runs; add 'params', 'cases' or 'grid'")
    if config.num_points <= CONFIRM_POINTS:  # larger sweeps are checked when planned (after --yes)
        check_points(config, plan_runs(config))
    return config


def check_points(config: ExperimentConfig, runs: list[Run]) -> None:
    """``ConfigError`` if two points have the same parameters."""
    seen: dict[str, Mapping[str, Any]] = {}
    for run in runs:
        if run.run_id in seen:
            raise ConfigError(f"{_where(config.path)}: two points have the same parameters {dict(run.params)}; "
                              f"remove the duplicate from 'cases' or 'grid'")
        seen[run.run_id] = run.params


def _file_kind(path: Path) -> str:

    mode = path.stat().st_mode
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def load_config(path: str | Path, root: str | Path | None = None) -> ExperimentConfig:
    """Read and validate an experiment config (YAML); a relative path, and the config's relative
    ``notebook``, mean the current directory (or ``root``)."""
    import yaml  # noqa: PLC0415 - optional dependency: the core installs with numpy only

    path = Path(path).expanduser()
    if not path.is_absolute() and root is not None:
        path = resolve_root(root) / path
    if path.is_dir():
        raise ConfigError(f"{path} is a folder; give a config file, e.g. experiments/table4_pure_pp_cpu.yaml")
    if not path.is_file():
        if path.exists():  # a FIFO, a socket, a device: never opened (reading a FIFO blocks)
            raise ConfigError(f"{path} is not a regular file ({_file_kind(path)}); give a config file, e.g. "
                              f"experiments/table4_pure_pp_cpu.yaml")
        raise ConfigError(f"{path}: no such config file; configs live in experiments/*.yaml")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size:,} bytes, larger than a config can be ({MAX_CONFIG_BYTES >> 20} MiB); "
                          f"give an experiment config (experiments/*.yaml)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text (UTF-8) file (byte {exc.start}); give a YAML config") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: C speed
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        detail = f"{context}, {problem}" if context else problem
        raise ConfigError(f"{at}: not valid YAML{where}: {detail}".splitlines()[0]) from None
    return config_from_dict(data, path, root=root)


def make_run_id(params: Mapping[str, Any]) -> str:
    canonical = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:8]
    parts = [str(params[k]) for k in ("schedule", "schedules", "model", "p", "m")
             if k in params and (k != "schedules" or params[k])]
    # the levers name the point too (three 1F1B points with different levers stay told apart)
    parts += [f"{k}-{params[k]}" for k in ("recompute", "offload") if params.get(k) not in (None, "none", 0)]
    label = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", x) for x in parts) or "run"
    return f"{label}_{digest}"


def plan_runs(config: ExperimentConfig) -> list[Run]:
    """Every point of ``config`` in a stable order: cases × grid, merged over ``params``."""
    keys = list(config.grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(config.grid[k] for k in keys))]
    runs = []
    for case in config.cases or ({},):
        for combo in combos:
            point = {**config.params, **case, **combo}
            if "m_per_p" in point:
                factor = point.pop("m_per_p")
                if "p" not in point or not isinstance(point["p"], int) or not isinstance(factor, int):
                    raise ConfigError(f"{_where(config.path)}: 'm_per_p' needs integer 'p' and 'm_per_p' in the "
                                      f"same point, got p={short_repr(point.get('p'))}, m_per_p={short_repr(factor)}")
                point["m"] = factor * point["p"]
            runs.append(Run(make_run_id(point), point))
    return runs


def check_parameters(notebook: Path, names: Iterable[str]) -> dict[str, Any]:
    """Raise ``ConfigError`` if any name is not a parameter of ``notebook``'s ``parameters``
    cell; returns papermill's parameter description."""
    import papermill  # noqa: PLC0415 - papermill takes ~3 s to import; only notebook runs need it

    declared = papermill.inspect_notebook(str(notebook))
    if not declared:
        raise ConfigError(f"{notebook}: has no cell tagged 'parameters'; tag the first code cell 'parameters'")
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise ConfigError(f"parameter(s) {unknown} are not declared in {notebook.name}'s parameters cell; "
                          f"valid names: {', '.join(declared)}")
    return declared
