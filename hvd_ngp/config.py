"""Command line, environment and config files.

Precedence, highest first: command-line flags > ``HVD_NGP_*`` environment variables > the
``--config`` file > built-in defaults.

A config file is JSON in instant-ngp style: network blocks (``encoding``, ``network``,
``dir_encoding``, ``rgb_network``, ``loss``, ``optimizer``, ``marching``, ``distributed``),
a ``"parent"`` chain merged like JSON merge-patch, and top-level scalar keys that set trainer
options (``"n_steps": 2000``). The seed guides' ``"training": {"precision", "batch_size"}`` block
sets ``--precision`` and ``--target_samples``. A block given on the command line or in the
environment (``--encoding '{"log2_hashmap_size": 15}'``) is merge-patched over the file's block; the
``network`` block's option is ``--density_network`` (``--network`` clashes with horovodrun's options).
Files with another extension use configargparse's ``key = value`` syntax.

``parse_settings`` is the trainer's entry: parse once, ``validate``, and return the typed, frozen
``settings.Settings`` (one group per concern); ``parse_args`` keeps a flat Namespace view for tools and
tests that read flags by name.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import configargparse

from .cluster.comm import CommFlags, CommSettings, add_options as add_comm_options
from .cluster.hvdtools import add_options as add_horovod_tool_options
from .cluster.preempt import DEFAULT_SIGNALS, parse_signals
from .data.pipeline import DataFlags, DataSettings
from .errors import ConfigError, read_json_object
from .observe.metrics import UNLIMITED_STEPS
from .observe.monitor import MonitorFlags, MonitorSettings
from .options import options_from
from .settings import (
    EvalSettings,
    LoopSettings,
    ModelSettings,
    OutputSettings,
    RuntimeSettings,
    SceneSettings,
    Settings,
    StepSettings,
    ViewerSettings,
)

#: the built-in configs, package data (installed with the wheel; ``--config cpu.json`` names one from anywhere)
CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "nerf"
DEFAULT_STEPS = 2000
RAY_COUNT_MULTIPLE = 64  # the adaptive ray count moves in multiples of this (training.budget.RayBudget)
BASE_CONFIG = CONFIG_DIR / "base.json"
CPU_CONFIG = CONFIG_DIR / "cpu.json"

#: JSON blocks that describe the model and its training recipe; merged, never flattened.
BLOCKS = ("encoding", "network", "dir_encoding", "rgb_network", "loss", "optimizer", "marching", "distributed")
#: command-line name of a block where the block's own name would clash with a horovodrun option
#: (argparse rejects "--network" as an ambiguous prefix of horovodrun's --network-interface(s))
BLOCK_OPTION = {block: ("density_network" if block == "network" else block) for block in BLOCKS}
#: keys of the seed guides' "training" block -> trainer option names
TRAINING_ALIASES = {"batch_size": "target_samples", "precision": "precision"}
#: top-level keys in a config file that are documentation only
IGNORED_KEYS = ("parent", "comment")


# ------------------------------------------------------------------------------------------ JSON


def merge_patch(base: dict, patch: dict) -> dict:
    """RFC 7386 merge-patch: dicts merge recursively, ``null`` deletes, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config_file(path: str | os.PathLike) -> Path:
    """``path`` itself when it exists; else the built-in config it names: ``cpu.json``, ``cpu`` or the
    checkout's old spelling ``configs/nerf/cpu.json`` (from any directory). Unknown names stay as given,
    so the caller's error names the file."""
    given = Path(path).expanduser()
    if given.exists():
        return given
    name = given.name if given.suffix == ".json" else f"{given.name}.json"
    folder = given.parent.as_posix()
    if folder in (".", "configs/nerf", "nerf") and (CONFIG_DIR / name).is_file():
        return CONFIG_DIR / name
    return given


def load_json_config(path: str | os.PathLike, _seen: tuple[Path, ...] = ()) -> dict:
    """Load an instant-ngp style JSON config, resolving its ``"parent"`` chain (paths relative to the file;
    a parent that is not there may name a built-in config, see ``config_file``)."""
    path = config_file(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"{path}: circular 'parent' chain: {chain}")
    data = read_json_object(path, ConfigError, "config file")
    parent = data.get("parent")
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{path}: 'parent' must be a file name, found {parent!r}")
        local = path.parent / parent
        data = merge_patch(load_json_config(local if local.exists() else parent, (*_seen, path)), data)
    data.pop("parent", None)
    return data


def json_object(text: str) -> dict:
    """argparse ``type``: a command-line JSON object (a block such as ``--marching``), else a usage error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc.msg} at column {exc.colno}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


class NgpConfigFileParser(configargparse.ConfigFileParser):
    """``.json`` files: instant-ngp style with ``parent``; anything else: configargparse's default syntax."""

    def __init__(self) -> None:
        super().__init__()
        self.known: set[str] = set()  # option names a file may set (filled in by build_parser)

    def get_syntax_description(self) -> str:
        return (
            "JSON in instant-ngp style (network blocks, 'parent' chain, top-level trainer options), "
            "or 'key = value' lines for other extensions"
        )

    def parse(self, stream) -> OrderedDict:
        name = getattr(stream, "name", "")
        if not str(name).endswith(".json"):
            return configargparse.DefaultConfigFileParser().parse(stream)
        data = load_json_config(name)
        items: OrderedDict[str, Any] = OrderedDict()
        for key, value in data.items():
            if key in IGNORED_KEYS:
                continue
            if key == "training":
                if not isinstance(value, dict):
                    raise ConfigError(f"{name}: 'training' must be an object")
                for sub, sub_value in value.items():
                    if sub not in TRAINING_ALIASES:
                        raise ConfigError(f"{name}: unknown key training.{sub} (known: {', '.join(TRAINING_ALIASES)})")
                    items[TRAINING_ALIASES[sub]] = _scalar(sub_value)
            elif key in BLOCKS:  # merged by resolve_model(), which re-reads the file
                if not isinstance(value, dict):
                    raise ConfigError(f"{name}: block {key!r} must be a JSON object")
            elif isinstance(value, dict):
                raise ConfigError(f"{name}: unknown block {key!r} (known blocks: {', '.join(BLOCKS)}, training)")
            elif self.known and key not in self.known:
                near = difflib.get_close_matches(key, sorted(self.known), n=3, cutoff=0.75)
                hint = (
                    f"did you mean {' or '.join(map(repr, near))}?" if near else "see --help for the trainer's options"
                )
                raise ConfigError(f"{name}: unknown option {key!r} ({hint})")
            elif isinstance(value, list):
                items[key] = ",".join(str(v) for v in value)
            else:
                items[key] = _scalar(value)
        return items


def _positive_list(kind: type, what: str) -> Callable[[str], list]:
    """An argparse type: "a,b,c" (or a JSON-like "[a, b]") of positive ``kind`` values -> sorted, without repeats."""

    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in str(text).replace(" ", "").strip("[]").split(",") if v]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"{what} must be positive, got {text!r}")
        return sorted(set(values))

    return parse


_seconds_list = _positive_list(float, "seconds")
_steps_list = _positive_list(int, "step numbers")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ------------------------------------------------------------------------------------------ CLI


class HelpFormatter(configargparse.ArgumentDefaultsHelpFormatter):
    """Defaults in ``--help`` once: not where the help text already says its default, nor for flags that
    default to nothing (None, off, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = (
            action.default is None
            or action.default is False
            or action.default == []
            or action.default == argparse.SUPPRESS
        )
        if nothing or "default" in text.lower():
            return text
        return super()._get_help_string(action)


class TrainerParser(configargparse.ArgumentParser):
    """The trainer's parser: a usage error is one line (an unknown flag with the nearest known ones), exit 2,
    instead of argparse's usage dump of every flag."""

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            message = (
                "; ".join(
                    unknown_flag(self, token) for token in message[len(prefix) :].split() if token.startswith("-")
                )
                or message
            )
        print(f"{self.prog}: error: {message}; see --help", file=sys.stderr, flush=True)
        raise SystemExit(2)


def unknown_flag(parser: argparse.ArgumentParser, token: str) -> str:
    """ "unknown option --n_step (did you mean --n_steps?)": ``token`` with the parser's nearest flags (difflib)."""
    flag = token.split("=", 1)[0]
    known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    near = difflib.get_close_matches(flag, known, n=3, cutoff=0.75)
    return f"unknown option {flag}" + (f" (did you mean {' or '.join(near)}?)" if near else "")


def build_parser(prog: str = "hvd_ngp.train") -> configargparse.ArgumentParser:
    """The trainer's argument parser, its ``--help`` grouped as the settings are (``settings.*.TITLE``), with
    each default shown once."""
    file_parser = NgpConfigFileParser()
    p = TrainerParser(
        prog=prog,
        description="Train an instant-ngp style NeRF with Horovod. Run under horovodrun/mpirun for several ranks.",
        formatter_class=HelpFormatter,
        config_file_parser_class=file_parser,
        auto_env_var_prefix="HVD_NGP_",
        add_env_var_help=False,
        add_config_file_help=False,
    )
    p.add_argument(
        "--config",
        is_config_file=True,
        metavar="FILE",
        help=f"JSON config (instant-ngp style, 'parent' chains). Default: {BASE_CONFIG.name} on GPU, "
        f"{CPU_CONFIG.name} on CPU",
    )

    g = p.add_argument_group(SceneSettings.TITLE)
    g.add_argument(
        "--scene",
        default="builtin",
        help="'builtin' (generated procedurally and cached), a scene folder, or a transforms*.json file",
    )
    g.add_argument(
        "--scene_cache",
        default=os.path.join(os.path.expanduser("~"), ".cache", "hvd_ngp", "scenes"),
        help="where the built-in scene is generated",
    )
    g.add_argument("--builtin_seed", type=int, default=0, help="seed of the built-in scene generator")
    g.add_argument("--train_split", default="train", help="split trained on (transforms_<split>.json)")
    g.add_argument("--test_split", default="test", help="split evaluated on (transforms_<split>.json)")
    g.add_argument(
        "--holdout_every",
        type=int,
        default=0,
        help="for a single transforms.json: every N-th frame is a test view and not trained on (0: none)",
    )
    g.add_argument("--downscale", type=int, default=1, help="integer image downscale factor applied at load time")
    g.add_argument(
        "--sharpness_threshold",
        type=float,
        default=0.0,
        help="discard frames whose 'sharpness' field is below this (0: keep all)",
    )
    g.add_argument(
        "--mask_mode",
        choices=("alpha", "exclude"),
        default="alpha",
        help="nerfstudio mask_path (0 = masked out): alpha: masked pixels train as transparent; exclude: "
        "they are never drawn for training nor counted in test PSNR (docs/your-own-capture.md)",
    )

    g = p.add_argument_group(ModelSettings.TITLE)
    g.add_argument(
        "--backend",
        choices=("auto", "torch", "cpp", "triton", "tcnn"),
        default="auto",
        help="compute path: torch (reference), cpp (C++ CPU hash grid), triton (GPU kernels for the hash "
        "grid, marching and compositing), tcnn (tiny-cuda-nn hash grid and MLPs, Triton marching and "
        "compositing; optional, not on PyPI); auto picks the fastest available",
    )
    g.add_argument(
        "--precision",
        choices=("auto", "fp32", "fp16", "bf16"),
        default="auto",
        help="autocast precision of the MLPs (fp16 uses a gradient scaler); auto: bf16 with the triton "
        "backend on a CUDA GPU (there it trains the MLPs with the fused kernels: 1.3x the samples/s, "
        "+0.2 dB at 60 s on lego, docs/BENCHMARKS.md), fp32 otherwise",
    )

    g = p.add_argument_group(RuntimeSettings.TITLE)
    g.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="compute device")
    g.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: cores / ranks on this node)")
    g.add_argument(
        "--gpu_memory_gb",
        type=float,
        default=0.0,
        help="GPU memory this process may use, in GiB: step buffers, evaluation and rendering chunks are "
        "planned from it, and the process is capped to it (0: the GPU's free memory at start minus a "
        "margin, shared by the ranks on that GPU)",
    )

    add_comm_options(p)
    add_horovod_tool_options(p)

    g = p.add_argument_group(StepSettings.TITLE)
    g.add_argument(
        "--target_samples",
        type=int,
        default=1 << 18,
        help="samples per step per rank; the ray count adapts to reach it",
    )
    g.add_argument(
        "--sample_fill",
        type=float,
        default=0.95,
        help="GPU fast path: the ray count aims at this fraction of --target_samples; above 1 (instant-ngp's "
        "way, e.g. 1.05) the step's buffers fill up and the rays that do not fit are left out of the "
        "loss; at most 2",
    )
    g.add_argument("--n_rays_init", type=int, default=4096, help="rays per step at the start, before adaptation")
    g.add_argument("--max_rays", type=int, default=1 << 20, help="upper bound of the adaptive ray count")
    g.add_argument(
        "--seed", type=int, default=1337, help="global seed; each rank's ray generator is seeded with seed + rank"
    )
    g.add_argument(
        "--train_background",
        choices=("random", "white", "black"),
        default="random",
        help="background composited behind RGBA training images",
    )
    g.add_argument(
        "--cuda_graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="replay the training step as CUDA graphs (auto: where it can be, i.e. a CUDA GPU, the triton "
        "backend, fp32 or bf16, no gradient accumulation, not elastic; on: an error where it "
        "cannot; off: the eager step, the reference)",
    )
    g.add_argument(
        "--graph_grid_update",
        choices=("auto", "on", "off"),
        default="auto",
        help="graphed steps: replay the occupancy grid's update after warm-up as a CUDA graph (the same "
        "grid, about a hundred launches fewer every 16 steps); auto: wherever the step is graphed "
        "and the grid is not split into model-parallel regions; on: the log says why where it cannot",
    )
    g.add_argument(
        "--draw_ahead",
        choices=("auto", "on", "off"),
        default="auto",
        help="graphed steps: draw the next step's rays while the GPU runs this one's forward and "
        "backward (the same rays as off; images on the device only); auto: wherever it can, "
        "on: also say in the log why it cannot",
    )
    g.add_argument(
        "--defer_verdict",
        choices=("auto", "on", "off"),
        default="auto",
        help="graphed steps with torch's fused Adam: the optimizer graph skips a non-finite step on the "
        "GPU and the host reads the non-finite guard's verdict during the next step, so it never "
        "waits for the GPU inside a step. auto: wherever it can; on: also say in the log why it "
        "cannot; off: the host waits for the verdict every step",
    )

    g = p.add_argument_group(LoopSettings.TITLE)
    g.add_argument(
        "--n_steps",
        type=int,
        default=None,
        help=f"training steps (default {DEFAULT_STEPS}; with --time_budget_s alone: until the budget ends)",
    )
    g.add_argument(
        "--time_budget_s",
        type=float,
        default=0.0,
        help="stop after this many seconds of training (0: no limit); checked every 8 steps against the slowest rank's training clock",
    )
    g.add_argument(
        "--budget_lr_decay",
        choices=("on", "off"),
        default="off",
        help="with --time_budget_s: learning rate x0.33 at 50%%, 75%% and 90%% of the budget (a step "
        "schedule keyed on training time, so a fixed budget ends at a low learning rate)",
    )
    g.add_argument("--log_every", type=int, default=100, help="steps between log lines")
    g.add_argument(
        "--watchdog_s",
        type=float,
        default=600.0,
        help="end this rank when no training step finished for this many seconds (0: off)",
    )
    g.add_argument(
        "--nonfinite_limit",
        type=int,
        default=10,
        help="stop after this many consecutive steps with a non-finite loss or gradients (each is skipped "
        "on every rank); 0: no check (saves one small allreduce and a host sync per step)",
    )
    g.add_argument(
        "--commit_every",
        type=int,
        default=50,
        help="elastic runs: commit the in-memory state every N steps (work lost on a failure)",
    )
    g.add_argument(
        "--stop_signals",
        default=DEFAULT_SIGNALS,
        metavar="SIG,SIG,...|none",
        help="signals that stop every rank at the next step boundary with a checkpoint in --ckpt_dir and "
        "exit status 75 (resume with --resume auto); 'none': the default actions",
    )

    g = p.add_argument_group(EvalSettings.TITLE)
    g.add_argument("--eval_every", type=int, default=0, help="evaluate test PSNR every N steps (0: only at the end)")
    g.add_argument(
        "--eval_at_s",
        type=_seconds_list,
        default=[],
        metavar="S1,S2,...",
        help="also evaluate when training time reaches these seconds (a PSNR-versus-time curve)",
    )
    g.add_argument(
        "--eval_at_steps",
        type=_steps_list,
        default=[],
        metavar="N1,N2,...",
        help="also evaluate after these steps (e.g. 6000,30000: PSNR at equal steps beside another trainer)",
    )
    g.add_argument("--n_eval_views", type=int, default=0, help="test views used for PSNR (0: all)")
    g.add_argument("--save_renders", type=int, default=8, help="test renders written as PNG at the end")
    g.add_argument(
        "--eval_background",
        choices=("white", "black"),
        default="white",
        help="background for evaluation of RGBA scenes (white is the NeRF-synthetic protocol)",
    )
    g.add_argument(
        "--eval_protocol",
        choices=("std", "ngp"),
        default="std",
        help="std: the NeRF-synthetic standard (--eval_background, one ray per pixel centre); ngp: "
        "instant-ngp's scripts/run.py (opaque black, 8 samples per pixel centre with stratified "
        "step offsets averaged in linear light, the reference composited in linear light)",
    )

    g = p.add_argument_group(OutputSettings.TITLE)
    g.add_argument("--out_dir", default="runs/latest", help="folder for renders, metrics and snapshots (rank 0 only)")
    g.add_argument("--metrics_json", default=None, help="write final metrics here as JSON (rank 0)")
    g.add_argument("--save_snapshot", default=None, help="write a snapshot here at the end (rank 0)")
    g.add_argument("--load_snapshot", default=None, help="start from this snapshot (model, grid, optimizer, step)")
    g.add_argument("--ckpt_dir", default=None, help="checkpoint folder (default: <out_dir>/checkpoints)")
    g.add_argument("--ckpt_every", type=int, default=0, help="write a checkpoint every N steps (0: off)")
    g.add_argument(
        "--ckpt_every_minutes",
        type=float,
        default=0.0,
        help="write a checkpoint every M minutes of training time (0: off; read from the shared training clock every 8 steps)",
    )
    g.add_argument("--ckpt_keep", type=int, default=3, help="checkpoints kept in --ckpt_dir (the newest)")
    g.add_argument(
        "--resume",
        default=None,
        metavar="auto|PATH",
        help="'auto': continue from the newest valid checkpoint in --ckpt_dir (start fresh if none); "
        "or a checkpoint file or folder",
    )
    g.add_argument(
        "--allow_resume_changes",
        action="store_true",
        help="resume (or --load_snapshot) even when the checkpoint was trained on another scene or other "
        "model, loss or marching settings (refused by default, naming each difference)",
    )

    MonitorSettings.add_options(p)
    DataSettings.add_options(p)

    g = p.add_argument_group(ViewerSettings.TITLE)
    g.add_argument(
        "--viewer",
        type=int,
        default=0,
        metavar="PORT",
        help="serve a live view of the training on this port from rank 0 (0: off); open "
        "http://HOST:PORT in a browser (on a cluster through an ssh tunnel to rank 0's node)",
    )
    g.add_argument(
        "--viewer_host", default="127.0.0.1", help="address the viewer listens on (0.0.0.0: every interface)"
    )
    g.add_argument(
        "--viewer_budget_ms",
        type=float,
        default=100.0,
        help="time budget of one viewer frame: the frame size adapts to it",
    )
    g.add_argument(
        "--viewer_share",
        type=float,
        default=0.03,
        help="largest share of the wall time that viewer frames may take from training (a watched run slows by "
        "about this share plus ~1%%: docs/viewer.md)",
    )

    g = p.add_argument_group("network blocks (JSON merge-patch over the config file's block)")
    for block, option in BLOCK_OPTION.items():
        g.add_argument(
            f"--{option}", type=json_object, default=None, metavar="JSON", help=f"patch for the '{block}' block"
        )
    file_parser.known = {a.dest for a in p._actions if a.dest not in BLOCK_OPTION.values()} - {"config", "help"}
    return p


def parse_settings(argv: Sequence[str] | None = None, default_config: Path | None = None) -> Settings:
    """Parse CLI/env/config once, validate, and return the typed settings (``settings.Settings``).

    ``default_config`` is used when neither ``--config`` nor ``HVD_NGP_CONFIG`` names one.
    """
    return validate(parse_flags(argv, default_config))


def parse_args(argv: Sequence[str] | None = None, default_config: Path | None = None) -> argparse.Namespace:
    """The validated flags as a flat Namespace, for tools and tests that read or change flags by name (the
    trainer itself takes ``parse_settings``'s typed groups; ``training.trainer.as_settings`` turns a Namespace
    into them). The values ``validate`` derives are copied on: ``n_steps`` resolved, ``stop_signal_names``,
    and the validated groups ``comm``, ``data`` and ``monitor``."""
    args = parse_flags(argv, default_config)
    s = validate(args)
    args.n_steps, args.stop_signal_names = s.loop.n_steps, s.loop.stop_signals
    args.comm, args.data, args.monitor = s.runtime.comm, s.data, s.monitor
    return args


def parse_flags(argv: Sequence[str] | None = None, default_config: Path | None = None) -> argparse.Namespace:
    """Parse CLI/env/config into the flags plus ``args.model`` (the merged network config dict) and
    ``args.config`` (the config file's resolved path), not yet validated."""
    argv = list(argv) if argv is not None else None
    parser = build_parser()
    if argv is None:
        argv = sys.argv[1:]
    explicit = any(a == "--config" or a.startswith("--config=") for a in argv) or "HVD_NGP_CONFIG" in os.environ
    if not explicit:
        argv = ["--config", str(default_config or BASE_CONFIG), *argv]
    argv = _with_config_file(argv)
    args = parser.parse_args(argv)
    config_path = _config_path(argv) or os.environ.get("HVD_NGP_CONFIG")
    args.config = str(Path(config_path).resolve()) if config_path else None
    args.model = resolve_model(args)
    return args


def _with_config_file(argv: list[str]) -> list[str]:
    """``argv`` with its ``--config`` value (or ``HVD_NGP_CONFIG``'s, moved onto the command line) resolved by
    ``config_file``, so built-in configs load by name from any directory."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--config" and i + 1 < len(out):
            out[i + 1] = str(config_file(out[i + 1]))
            return out
        if a.startswith("--config="):
            out[i] = "--config=" + str(config_file(a.split("=", 1)[1]))
            return out
    env = os.environ.get("HVD_NGP_CONFIG")
    if env is not None and config_file(env) != Path(env).expanduser():
        out = ["--config", str(config_file(env)), *out]
    return out


def _config_path(argv: Sequence[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def resolve_model(args: argparse.Namespace) -> dict:
    """base.json blocks <- config file blocks (after its parent chain) <- CLI/env block patches."""
    model = {k: v for k, v in load_json_config(BASE_CONFIG).items() if k in BLOCKS}
    file_data = load_json_config(args.config) if args.config and args.config.endswith(".json") else {}
    for block, option in BLOCK_OPTION.items():
        for patch in (file_data.get(block), getattr(args, option)):
            if patch is not None:
                model[block] = merge_patch(model.get(block, {}), patch)
        setattr(args, option, None)  # the merged view lives in args.model only
    model["_source"] = args.config or str(BASE_CONFIG)
    return model


def validate(args: argparse.Namespace) -> Settings:
    """Cross-field checks with messages that say what was expected; returns the typed settings, with the
    values derived from the flags (the step count, the stop signals, the validated groups) computed here
    once. ``args`` is left as parsed."""
    n_steps = args.n_steps
    if n_steps is None:
        n_steps = UNLIMITED_STEPS if args.time_budget_s else DEFAULT_STEPS
    positive = ("target_samples", "n_rays_init", "max_rays", "log_every", "downscale", "ckpt_keep", "commit_every")
    for name, value in (("n_steps", n_steps), *((name, getattr(args, name)) for name in positive)):
        if value <= 0:
            raise ConfigError(f"--{name} must be positive, got {value}")
    if args.resume is not None and args.load_snapshot is not None:
        raise ConfigError("give --resume or --load_snapshot, not both")
    for name in (
        "gpu_memory_gb",
        "time_budget_s",
        "eval_every",
        "n_eval_views",
        "save_renders",
        "holdout_every",
        "threads",
        "ckpt_every",
        "ckpt_every_minutes",
        "watchdog_s",
        "nonfinite_limit",
    ):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name} must be >= 0, got {getattr(args, name)}")
    try:
        stop_signals = parse_signals(args.stop_signals)
    except ValueError as exc:
        raise ConfigError(f"--stop_signals: {exc}") from None
    if not 0 < args.sample_fill <= 2:
        raise ConfigError(f"--sample_fill must be in (0, 2], got {args.sample_fill}")
    if args.max_rays < RAY_COUNT_MULTIPLE:
        raise ConfigError(
            f"--max_rays must be at least {RAY_COUNT_MULTIPLE} (the ray count is a multiple of it), got {args.max_rays}"
        )
    if args.n_rays_init > args.max_rays:
        raise ConfigError(f"--n_rays_init ({args.n_rays_init}) exceeds --max_rays ({args.max_rays})")
    comm = CommSettings.from_flags(options_from(CommFlags, args, subset=True))  # + the "distributed" block
    if not 0 <= args.viewer <= 65535:
        raise ConfigError(f"--viewer must be a TCP port (1-65535, 0: off), got {args.viewer}")
    if args.viewer and comm.model_parallel > 1:
        raise ConfigError("--viewer: not available with --model_parallel (rank 0 holds one region only)")
    if args.viewer_budget_ms <= 0 or not 0 < args.viewer_share <= 1:
        raise ConfigError(
            f"--viewer_budget_ms must be > 0 and --viewer_share in (0, 1], got "
            f"{args.viewer_budget_ms:g} and {args.viewer_share:g}"
        )
    data = DataSettings.from_flags(options_from(DataFlags, args, subset=True))
    monitor = MonitorSettings.from_flags(options_from(MonitorFlags, args, subset=True))
    return Settings.from_namespace(args, n_steps, stop_signals, comm, data, monitor)
