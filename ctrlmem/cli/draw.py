"""``ctrlmem draw`` and ``ctrlmem figures``: schedule diagrams to files, and the paper's
schedule figures regenerated into ``figures/`` (docs/theory.md §9: Fig. 4, 5 and the Fig. 18 gallery).

    ctrlmem draw v-half -p 8 -m 32 --costs 1,1,1,0 --compare 1f1b,zb-v -o build/v-half.html
    ctrlmem draw 1f1b -p 4 -m 8 --view memory -o build/1f1b-memory.svg
    ctrlmem draw 1f1b -p 8 -m 32 --compare zb-h1,zb-h2,zb-v --view pareto -o build/pareto.html
    ctrlmem draw my_schedule.csv --costs 6,8,4,0.2 -o build/mine.pdf   # a torch/torchtitan CSV
    ctrlmem draw --state explorer.state.json -o build/shown.png          # what the explorer showed
    ctrlmem figures -o figures --format png,svg

``.html`` files embed plotly.js (they open offline); ``.png``, ``.svg`` and ``.pdf`` go through kaleido,
which drives a Chromium (Debian's ``chromium`` works with no settings).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from ctrlmem.schedules.registry import is_schedule_file
from ctrlmem.cli.args import CliError, add_optimize_argument, add_schedule_arguments, apply_memory_gb, float_arg, int_arg, optimize_schedule, optimize_summary, schedule_from_args
from ctrlmem.util.fileio import atomic_write, check_output_path
from ctrlmem.model.costs import Costs
from ctrlmem.model.ir import Schedule
from ctrlmem.schedules import SCHEDULES, build
from ctrlmem.model.simulate import simulate
from ctrlmem.search import buildingblock as blocks
from ctrlmem.search.buildingblock import build_from_block

__all__ = ["add_commands", "draw_figure", "PaperFigure", "paper_figures", "write_paper_figures"]

log = logging.getLogger(__name__)

VIEWS = ("schedule", "memory", "blocks", "lifespans", "bubble", "pareto")


def _plot():
    """ctrlmem.plots.figures, imported on first use so that `ctrlmem list` and friends don't load plotly."""
    from ctrlmem.plots import figures as plot  # noqa: PLC0415 - imports plotly; loaded on first drawing, not with ctrlmem --help

    return plot


def _compare_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """The same settings for another schedule: a memory limit only goes to budgeted ones."""
    other = argparse.Namespace(**vars(args))
    if name not in SCHEDULES:
        raise CliError(f"--compare: unknown schedule {name!r}; valid names: {', '.join(SCHEDULES)}")
    if not SCHEDULES[name].memory_limit:
        other.memory_limit = None
    other.param = [] if name != args.name else args.param
    return other


def _figure_title(args: argparse.Namespace, names: Sequence[str], p: int, m: int, costs: Costs) -> str:
    """The default title: schedules, p, m, costs and the memory budget (so that two drawings at
    different costs or budgets never look alike)."""
    budget = args.memory_limit if any(n in SCHEDULES and SCHEDULES[n].memory_limit for n in names) else None
    shown = [os.path.basename(n) for n in names]
    return f"{', '.join(shown)}: {_plot().setting_label(p, m, costs, budget)}"


def draw_figure(args: argparse.Namespace):
    """The figure ``ctrlmem draw`` writes, from its parsed arguments."""
    apply_memory_gb(args)  # --memory-gb -> args.memory_limit (once)
    names = [args.name] + [n.strip() for n in (args.compare or "").split(",") if n.strip()]
    style = {"width": args.width} if args.width else {}
    costs = Costs.parse(args.costs)
    if args.view in ("bubble", "pareto") and getattr(args, "optimize", None) is not None:
        raise CliError(f"--optimize improves one schedule; --view {args.view} sweeps memory limits: drop one of them")
    if args.view == "blocks" and getattr(args, "optimize", None) is not None:
        raise CliError("--view blocks shows how a registered schedule is built; an optimized schedule has no block: "
                       "use --view schedule or memory")
    if args.view in ("bubble", "pareto"):
        for name in names:
            if name not in SCHEDULES:
                raise CliError(f"--view {args.view} sweeps registered schedules over memory limits; "
                               f"{name!r} is not one (valid names: {', '.join(SCHEDULES)})")
        limits = [args.memory_limit] if args.memory_limit is not None else _plot().TRADEOFF_LIMITS
        points = _plot().tradeoff_points(names, args.devices, args.microbatches, costs,
                                         memory_limits=limits)
        if not points:
            raise CliError("no schedule could be built for these settings")
        make = _plot().bubble_memory_figure if args.view == "bubble" else _plot().pareto_figure
        title = args.title or f"{', '.join(names)}: {_plot().setting_label(args.devices, args.microbatches, costs)}"
        return make(points, title=title, **style)
    first, costs = schedule_from_args(args)
    given = args  # the caller's namespace: it reads the optimize result back
    if is_schedule_file(args.name):  # compare at the file's own p and m
        args = argparse.Namespace(**vars(args))
        args.devices, args.microbatches = first.num_devices, first.num_microbatches
        args.explicit = set()
    results = [simulate(first, costs)]
    improved, opt = optimize_schedule(args, first, costs)
    given.optimize_result = opt
    if opt is not None:  # the improved schedule on top, the input below it
        if improved is not first:
            results.insert(0, simulate(improved, costs))
    for name in names[1:]:
        schedule, _ = schedule_from_args(_compare_args(args, name), name)
        results.append(simulate(schedule, costs))
    p, m = first.num_devices, first.num_microbatches
    title = args.title or _figure_title(args, names, p, m, costs)
    if args.view == "schedule":
        return _plot().schedule_figure(results, title=title, **style)
    if args.view == "memory":
        return _plot().memory_figure(results, title=title, **style)
    if args.view == "lifespans":
        return _plot().lifespan_figure(results, title=title, **style)
    if len(names) > 1:
        raise CliError("--view blocks draws one schedule's construction; drop --compare")
    if is_schedule_file(args.name):
        raise CliError("--view blocks shows how a registered schedule is built; a schedule file has no block")
    return _plot().block_figure(args.name, p, m, costs=costs, title=title, **style)


def _cmd_draw(args: argparse.Namespace) -> int:
    out = args.output
    ext = out.rsplit(".", 1)[-1].lower() if "." in os.path.basename(out) else ""
    if ext not in ("html", "png", "svg", "pdf"):
        raise CliError(f"-o {out!r}: the file name must end in .html, .png, .svg or .pdf")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # the folder named is created
    check_output_path(out)  # a folder, a file where a folder should be: said before drawing
    if args.state:
        return _cmd_draw_state(args)
    if not args.name:
        raise CliError("give a schedule name (see `ctrlmem list`) or a schedule file, or --state FILE")
    from ctrlmem.plots.figures import MAX_DRAWN_DEVICES  # noqa: PLC0415 - imports plotly; loaded on first drawing, not with ctrlmem --help

    if args.devices > MAX_DRAWN_DEVICES:  # said before a schedule that large is built
        raise CliError(f"-p {args.devices}: a figure draws at most {MAX_DRAWN_DEVICES:,} devices; simulate it instead "
                       "(ctrlmem simulate)")
    if args.view == "explorer":
        raise CliError("--view explorer draws an explorer state file: add --state FILE")
    text = apply_memory_gb(args)
    if text:
        print(text, file=sys.stderr)
    fig = draw_figure(args)
    _plot().write_figure(fig, out, scale=args.scale)
    if getattr(args, "optimize_result", None) is not None:
        print(optimize_summary(args.optimize_result))
    print(f"wrote {out}")
    return 0


def _cmd_draw_state(args: argparse.Namespace) -> int:
    """``ctrlmem draw --state FILE``: what the explorer showed when it saved FILE, exactly."""
    from ctrlmem.explorer.views import draw_state  # noqa: PLC0415 - imports plotly and pandas; loaded on first drawing, not with ctrlmem --help

    if args.name:
        raise CliError(f"--state FILE draws the explorer's saved state; drop the schedule {args.name!r}")
    view = args.view if args.view_given else "explorer"
    try:
        out = draw_state(args.state, args.output, view=view, width=args.width, scale=args.scale)
    except FileNotFoundError:
        raise CliError(f"--state {args.state}: no such file; save one with the explorer's 'save state' button") from None
    except ValueError as exc:
        raise CliError(f"--state {args.state}: {exc}") from None
    print(f"wrote {out}")
    return 0


class _ViewGiven(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.view_given = True


# -- the paper's figures -----------------------------------------------------------------------

@dataclass(frozen=True)
class PaperFigure:
    """One regenerated figure: its file stem, what it shows, and how to make it."""

    stem: str
    caption: str
    make: Callable[[], object]


def _has_blocks(name: str, p: int, m: int = 8) -> bool:
    """Whether :mod:`ctrlmem.search.buildingblock` can make the paper's block ``name`` for ``p`` devices (``m``
    microbatches: GPipe's block depends on it)."""
    try:
        return _plot().paper_block(name, p, m) is not None
    except ValueError:
        return False


def _paper_schedule(name: str, p: int, m: int, costs: Costs) -> Schedule | None:
    """``name`` as the paper draws it — the registry's unit-cost pattern (not adapted to
    ``costs``: Fig. 5 shows what unequal costs do to the patterns), else its paper block
    (:mod:`ctrlmem.search.buildingblock`), else None."""
    del costs  # the figures simulate the pattern under the costs; they do not adapt it
    if name in SCHEDULES:
        return build(name, p, m)
    block = _plot().paper_block(name, p, m)
    if block is None:
        return None

    return blocks.build_from_block(block, m, name=name)


def _results(names: Sequence[str], p: int, m: int, costs: Costs) -> tuple[list, list[str]]:
    results, missing = [], []
    for name in names:
        schedule = _paper_schedule(name, p, m, costs)
        if schedule is None:
            missing.append(name)
        else:
            results.append(simulate(schedule, costs))
    return results, missing


GALLERY = (  # Fig. 18 panels (docs/theory.md §9); GEMS and Chimera have no generator here
    ("a", "1f1b"), ("b", "eager-1f1b"), ("c", "zb-h1"), ("d", "zb-h2"), ("e", "gpipe"),
    ("i", "interleaved-1f1b"),  # the blocks' interleaved block has a uniform interval: Fig. 18(i)
)


def paper_figures(num_devices: int = 4) -> tuple[list[PaperFigure], list[str]]:
    """The schedule figures of the paper that can be drawn now, and a note for each that
    cannot (a schedule not available yet)."""
    p = num_devices
    figs: list[PaperFigure] = []
    notes: list[str] = []
    unit = Costs(1, 1, 1, 0)

    fig4 = ["1f1b", "v-min", "v-half", "v-zb"]
    res, missing = _results(fig4, p, 10, unit)
    if missing:
        notes.append(f"Fig. 4 drawn without {', '.join(missing)} (not available)")
    if res:
        figs.append(PaperFigure(
            "fig04_schedules", f"Fig. 4: {', '.join(r.schedule.name for r in res)}; {p} devices, 10 microbatches, F=B=W",
            lambda res=res: _plot().schedule_figure(res, width=1300)))
        figs.append(PaperFigure(
            "fig04_memory", "Fig. 4 memory: activation per device over time, with theory and 1F1B peak",
            lambda res=res: _plot().memory_figure(res, width=1300)))

    costs5 = Costs(6, 8, 4, 0)  # T_F=3, T_B=4, T_W=2 per chunk pass (docs/theory.md §7 units note)
    res, missing = _results(["v-min", "v-half"], p, 10, costs5)
    if missing:
        notes.append(f"Fig. 5 drawn without {', '.join(missing)} (not available)")
    if res:
        figs.append(PaperFigure(
            "fig05_unequal_costs",
            "Fig. 5: T_F=3, T_B=4, T_W=2 per chunk pass: V-Min repeats a bubble every interval, V-Half tiles",
            lambda res=res: _plot().schedule_figure(res, width=1300)))

    if _has_blocks("interleaved-1f1b", 3) and _has_blocks("v-half", 3):
        figs.append(PaperFigure(
            "fig02_lifespans",
            "Fig. 2: summed lifespans per device, d=3: parallel (interleaved) vs V-shape (V-Half) placement",
            lambda: _plot().lifespan_figure(
                [_plot().paper_block("interleaved-1f1b", 3), _plot().paper_block("v-half", 3)],
                titles=["parallel placement (interleaved block)", "V-shape placement (V-Half block)"],
                width=900)))
    else:
        notes.append("Fig. 2: needs the paper's blocks (ctrlmem.search.buildingblock)")

    # Fig. 1: 1F1B and eager 1F1B, building block -> repeat -> squeeze (every step, m = 4).
    for letter, name in (("a", "1f1b"), ("b", "eager-1f1b")):
        if _has_blocks(name, p):
            figs.append(PaperFigure(
                f"fig01{letter}_{name}",
                f"Fig. 1({letter}) {name}: building block, repeated, then squeezed (m=4)",
                lambda name=name: _plot().block_figure(name, p, 4, width=1300)))
    # Fig. 3: the building blocks themselves (one microbatch each), 1F1B and the V blocks.
    fig3 = [n for n in ("1f1b", "v-half", "v-min", "v-zb") if _has_blocks(n, p)]
    if fig3:
        figs.append(PaperFigure(
            "fig03_blocks",
            f"Fig. 3: building blocks of {', '.join(fig3)} ({p} devices, slots of one chunk pass)",
            lambda: _plot().schedule_figure(
                [_plot().block_timelines(n, p, 10)[0] for n in fig3], width=1300,
                x_title=_plot().SLOTS_TITLE)))
    # Fig. 11: the same V-Half schedule squeezed without and with the warm-up/cool-down reorder.
    if _has_blocks("v-half", p):
        def fig11():

            block = _plot().paper_block("v-half", p, 10)
            plain = build_from_block(block, 10, name="v-half, squeezed (no reorder)",
                                            reorder_phases=False)
            final = build_from_block(block, 10, name="v-half, reordered then squeezed")
            return _plot().schedule_figure([simulate(plain), simulate(final)], width=1300)

        figs.append(PaperFigure(
            "fig11_reorder", "Fig. 11: V-Half squeezed (top) and reordered then squeezed (bottom); "
            "the reorder shortens warm-up and cool-down without raising the peak", fig11))

    for letter, name in GALLERY:
        if name not in SCHEDULES and _plot().paper_block(name, p, 8) is None:
            notes.append(f"Fig. 18({letter}) {name}: no generator or block available")
            continue

        def make(name=name):
            tls = _plot().block_timelines(name, p, 8)
            slots = _has_blocks(name, p)
            return _plot().schedule_figure([tls[0], tls[-1]], width=1300,
                                           x_title=_plot().SLOTS_TITLE if slots else "time (cost units)")

        figs.append(PaperFigure(f"fig18{letter}_{name}",
                                f"Fig. 18({letter}) {name}: building block above the final schedule (m=8)",
                                make))
    if "interleaved-1f1b" in SCHEDULES:  # Megatron's own order repeats non-uniformly: no single block
        figs.append(PaperFigure(
            "fig18h_interleaved-1f1b-megatron",
            "Fig. 18(h) interleaved 1F1B in Megatron's order (non-uniform repeat interval, so no single "
            "block; the registered schedule, m=8)",
            lambda: _plot().schedule_figure(simulate(build("interleaved-1f1b", p, 8)), width=1300)))
    notes.append("Fig. 18(f) GEMS and (g) Chimera: no generator here (two model replicas)")
    return figs, notes


def write_paper_figures(out_dir: str = "figures", formats: Sequence[str] = ("png", "svg"),
                        only: Sequence[str] | None = None, num_devices: int = 4) -> list[str]:
    """Regenerate the paper's schedule figures into ``out_dir`` (one file per figure and
    format) and an index ``out_dir/schedule_figures.md``. Returns the paths written."""
    figs, notes = paper_figures(num_devices)
    if only:
        figs = [f for f in figs if any(f.stem.startswith(o) for o in only)]
    os.makedirs(out_dir, exist_ok=True)
    jobs = []
    drawn = []
    for f in figs:
        try:
            fig = f.make()
        except ValueError as exc:  # a generator or block that rejects these settings
            notes.append(f"{f.stem}: not drawn: {exc}")
            continue
        drawn.append(f)
        for ext in formats:
            jobs.append((fig, os.path.join(out_dir, f"{f.stem}.{ext}")))
    paths = _plot().write_figures(jobs)
    if not only:
        index = os.path.join(out_dir, "schedule_figures.md")
        text = "# Schedule figures (regenerate: `ctrlmem figures -o figures`)\n\n"
        text += "".join(f"- `{f.stem}`: {f.caption}\n" for f in drawn)
        if notes:
            text += "\nNot drawn / partial:\n\n" + "".join(f"- {n}\n" for n in notes)
        atomic_write(index, text)
        paths.append(index)
    for n in notes:
        log.warning("%s", n)
    return paths


def _cmd_figures(args: argparse.Namespace) -> int:
    formats = [x.strip().lower() for x in args.format.split(",") if x.strip()]
    bad = [x for x in formats if x not in ("png", "svg", "html", "pdf")]
    if bad or not formats:
        raise CliError(f"--format takes a comma list of png, svg, html, pdf; got {args.format!r}")
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    for path in write_paper_figures(args.output, formats, only, args.devices):
        print(f"wrote {path}")
    return 0


def add_commands(subparsers) -> None:
    """Add ``draw`` and ``figures`` to the ``ctrlmem`` command line."""
    p = subparsers.add_parser("draw", help="draw a schedule (diagram, memory, blocks) to .html/.png/.svg/.pdf")
    p.add_argument("name", nargs="?", default=None,
                   help="schedule name (see `ctrlmem list`), or a schedule file: a torch / torchtitan pipelining "
                        "CSV or ctrlmem's text form (not with --state)")
    add_schedule_arguments(p, name=False)
    p.add_argument("--state", metavar="FILE|LINK", default=None,
                   help="an explorer state file ('save state') or state link ('share link'): draw exactly what "
                        "the explorer showed; .html "
                        "gives its report, .png/.svg/.pdf its diagram above its memory curves (--view schedule "
                        "or memory: one of them)")
    add_optimize_argument(p)
    p.add_argument("--compare", metavar="NAME2,...", default="",
                   help="more schedules stacked on the same time axis (same p, m, costs)")
    p.add_argument("--view", choices=VIEWS + ("explorer",), default="schedule", action=_ViewGiven,
                   help="schedule diagram (default), memory curves, building blocks, lifespan bars, "
                        "bubble rate vs memory, throughput vs memory (Pareto); with --state: explorer "
                        "(default), schedule or memory")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output file: .html (offline, plotly.js embedded), .png, .svg or .pdf")
    p.add_argument("--title", default=None, help="figure title (default: schedules, p, m, costs, budget)")
    p.add_argument("--width", type=int_arg(100, 16384, "pixels"), default=None,
                   help="figure width in pixels (100 to 16384)")
    p.add_argument("--scale", type=float_arg(maximum=10, what="PNG pixels per layout pixel"), default=2.0,
                   help="PNG pixel scale, > 0 and at most 10 (default 2)")
    p.set_defaults(func=_cmd_draw, view_given=False)

    f = subparsers.add_parser("figures", help="regenerate the paper's schedule figures (Fig. 1-5, 11, 18)")
    f.add_argument("-o", "--output", default="figures", metavar="DIR", help="output folder (default figures/)")
    f.add_argument("--format", default="png,svg", help="comma list of png, svg, html, pdf (default png,svg)")
    f.add_argument("--only", default=None, metavar="STEM,...", help="only figures whose stem starts so, e.g. fig04")
    f.add_argument("-p", "--devices", type=int_arg(2, 64), default=4, help="devices (default 4, as in the paper)")
    f.set_defaults(func=_cmd_figures)


if __name__ == "__main__":  # pragma: no cover
    from ctrlmem.cli import main

    sys.exit(main(["figures", *sys.argv[1:]]))
