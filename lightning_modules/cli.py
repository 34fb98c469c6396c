"""The LightningCLI entry point: ``python -m lightning_modules fit --config configs/...yaml``.

Sizes flow from the DataModule (:class:`~lightning_modules.base.BenchmarkDataModule`) into the
model and into a loss that owns a head, so recipes never hard-code them:

* ``data.num_classes`` -> ``model.init_args.num_classes`` and ``model.init_args.loss.init_args.num_classes``
* ``data.num_users`` / ``data.num_items`` / ``data.input_dim`` / ``data.in_chans`` -> the model's arguments of the same name
* ``model.init_args.embedding_dim`` -> ``model.init_args.loss.init_args.embedding_dim`` (a head's input width)
* ``data.class_counts`` (per-class training counts, where the DataModule has them: the digits, MNIST
  and image-folder classification DataModules) -> ``model.init_args.loss.init_args.class_counts``
  and, normalised to sum to 1, ``model.init_args.loss.init_args.class_prior``, for losses built
  from the training label distribution: a plain list (ints / floats), or a tensor where the loss's
  constructor hints the argument as a tensor (:func:`adapt_to_hint`)

A link whose target the chosen class does not take is skipped, and so is a link from an attribute
the chosen DataModule does not have, so one CLI serves every benchmark. CPU is the default accelerator. Every run ends with a short table of the logged
metrics and the output folder (:class:`~lightning_modules.summary.MetricsSummary`), printed
last and once: ``validate`` and ``test`` do not print Lightning's own results table as well
(``--verbose=true`` brings it back).

Errors: a command that fails (a bad argument, a class that refuses its arguments, an error
while training) prints two lines on standard error instead of a traceback: how to get the full
traceback, then ``error: <message>``, where the message is the one the project's code raised
(e.g. ``ImageFolderDataModule: root is not a folder (got 'data/images'); ...``), found inside the
exceptions that jsonargparse wraps it in (:func:`error_message`). The exit status is 2 for an
error before the run starts (parsing or instantiating the classes) and 1 for an error during it.
Set ``LOSSES_DEBUG=1`` in the environment to get the full traceback instead.

Quiet runs: while the CLI runs, Lightning's tips about its cloud products, its notice that
TensorBoard is not installed (the CSV logger is used), torch's ``LeafSpec`` deprecation warning
and, in ``validate`` / ``test``, the checkpoint callback's "dirpath has changed" notice are
dropped. Only the CLI does this: importing :mod:`losses` or :mod:`lightning_modules` changes no
warning or logging setting, and the filters are removed when :func:`main` returns.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import traceback
import warnings
import collections.abc
import inspect
import typing
from types import MethodType
from typing import Any, Iterator, List, Optional, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pytorch_lightning.cli import LightningCLI  # noqa: E402

import losses as _losses  # noqa: E402

import torch  # noqa: E402

from .base import BenchmarkDataModule, BenchmarkModule, _import_class  # noqa: E402
from .optim import resolve_total_steps  # noqa: E402
from .summary import MetricsSummary, ParameterSummary  # noqa: E402

SIZE_LINKS = ("num_users", "num_items", "input_dim", "in_chans")
DEBUG_ENV = "LOSSES_DEBUG"  #: set to 1 for full tracebacks instead of the one-line ``error:`` form
SUBCOMMANDS = ("fit", "validate", "test", "predict")

#: (message regex, category) of the third-party warnings the CLI drops, all harmless in its runs
QUIET_WARNINGS: Tuple[Tuple[str, type], ...] = (
    (r"Starting from v1\.9\.0, `tensorboardX` has been removed", Warning),  # the CSV logger is used
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),  # raised inside Lightning
)
#: dropped in ``validate`` / ``test`` only: they load weights, not the checkpoint callback's state
QUIET_EVAL_WARNINGS: Tuple[Tuple[str, type], ...] = (
    (r"The dirpath has changed from ", Warning),
)
#: start of Lightning's info lines that advertise its cloud products
QUIET_LOG_PREFIXES = ("\U0001f4a1 Tip:",)
_LIGHTNING_LOGGERS = (
    "pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
)


def _ignore(rules) -> None:
    for message, category in rules:
        warnings.filterwarnings("ignore", message=message, category=category)


def counts_list(counts) -> List[int]:
    """``data.class_counts`` as the plain list of ints linked into a loss's ``class_counts``."""
    return [int(c) for c in (counts.tolist() if hasattr(counts, "tolist") else counts)]


def prior_list(counts) -> List[float]:
    """``data.class_counts`` normalised to sum to 1: the class prior linked into a loss's ``class_prior``."""
    values = counts_list(counts)
    total = sum(values)
    if total <= 0:
        raise ValueError(f"class_prior: the training split has no labelled example (got class counts {values}); "
                         "check the DataModule's training split")
    return [c / total for c in values]


def _wants_tensor(hint: Any) -> bool:
    """Whether a constructor type hint takes a tensor and no plain sequence (``Tensor``,
    ``Optional[Tensor]``); a hint that also takes a list (``Sequence[float]``, a union with one) or
    no hint at all gets the list."""
    import torch

    if isinstance(hint, type):
        return issubclass(hint, torch.Tensor)
    if typing.get_origin(hint) is typing.Union:
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if any(typing.get_origin(a) in (list, tuple, collections.abc.Sequence) or a in (list, tuple) for a in members):
            return False
        return any(_wants_tensor(a) for a in members)
    return False


def adapt_to_hint(cls: Optional[type], arg: str, values: List[Any]) -> Any:
    """``values`` (a plain list) in the form the constructor argument ``arg`` of ``cls`` is type-hinted
    with: a float32 / int64 tensor for a tensor hint, else the list itself."""
    if cls is None:
        return values
    try:
        hint = typing.get_type_hints(cls.__init__).get(arg)
    except Exception:  # unresolvable annotations: the plain list
        return values
    if _wants_tensor(hint):
        import torch

        return torch.tensor(values, dtype=torch.float32 if any(isinstance(v, float) for v in values) else torch.int64)
    return values


def _takes(cls: Optional[type], arg: str) -> bool:
    return cls is not None and arg in accepted_arguments(cls)


def _linked_class_counts(loss_class: Optional[type], data: Any) -> Any:
    """``data.class_counts`` in the form ``loss_class`` takes them, or ``None`` where it takes none
    or ``data`` has no counts (read only then: the counts may need the DataModule's setup)."""
    if not _takes(loss_class, "class_counts") or not hasattr(type(data), "class_counts"):
        return None
    return adapt_to_hint(loss_class, "class_counts", counts_list(data.class_counts))


def _linked_class_prior(loss_class: Optional[type], data: Any) -> Any:
    """The class prior from ``data.class_counts`` in the form ``loss_class`` takes it, or ``None``."""
    if not _takes(loss_class, "class_prior") or not hasattr(type(data), "class_counts"):
        return None
    return adapt_to_hint(loss_class, "class_prior", prior_list(data.class_counts))


def linked_loss_kwargs(loss_class: type, data: Any, *, embedding_dim: Optional[int] = None) -> dict:
    """The constructor arguments of ``loss_class`` that the CLI links from the DataModule ``data``
    (and from the model's ``embedding_dim``), for code that builds the objects by hand (e.g.
    ``examples/lightning_loop.py``): ``num_classes``, ``embedding_dim``, and ``class_counts`` /
    ``class_prior`` from ``data.class_counts`` -- each only where ``loss_class`` takes it and
    ``data`` has the source, in the form the CLI passes (:func:`counts_list`, :func:`prior_list`,
    :func:`adapt_to_hint`)."""
    out: dict = {}
    if _takes(loss_class, "num_classes") and hasattr(data, "num_classes"):
        out["num_classes"] = int(data.num_classes)
    if embedding_dim is not None and _takes(loss_class, "embedding_dim"):
        out["embedding_dim"] = int(embedding_dim)
    for name, value in (("class_counts", _linked_class_counts(loss_class, data)),
                        ("class_prior", _linked_class_prior(loss_class, data))):
        if value is not None:
            out[name] = value
    return out


class LossCLI(LightningCLI):
    """LightningCLI with the size and class-count links described in the module docstring.

    A command that names its subcommand first (``fit ...``, ``test ...``) builds that subcommand's
    parser only: Lightning builds one per subcommand (fit, validate, test, predict), each from the
    signatures of the trainer, the model and the data module, and three of the four were never read
    (~0.4 s of every start). Without a subcommand first (``--help``, a dict of arguments) all four
    are built, as Lightning does.
    """

    _loss_class: Optional[type] = None  #: the chosen loss class, read before the classes are built

    def __init__(self, *args, **kwargs):
        argv = kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        first = argv[0] if isinstance(argv, (list, tuple)) and argv else None
        self._only_subcommand = first if isinstance(first, str) and first in LightningCLI.subcommands() else None
        super().__init__(*args, **kwargs)

    def _add_subcommands(self, parser, **kwargs) -> None:
        only = self._only_subcommand
        if only is None:
            return super()._add_subcommands(parser, **kwargs)
        every = type(self).subcommands()
        self.subcommands = lambda: {only: every[only]}  # read by the loop of the base class only
        try:
            super()._add_subcommands(parser, **kwargs)
        finally:
            del self.subcommands

    def before_instantiate_classes(self) -> None:  # noqa: D102
        config = self.config[self.subcommand] if self.subcommand else self.config
        try:
            path = config.get("model.init_args.loss.class_path")
        except (KeyError, AttributeError):
            path = None
        self._loss_class = _import_class(path) if isinstance(path, str) else None

    def _linked_counts(self, data) -> Any:
        # the DataModule itself is the link's source, so that its training counts (which need its
        # setup) are read only for a loss that takes them; for any other loss the link is skipped
        return _linked_class_counts(self._loss_class, data)

    def _linked_prior(self, data) -> Any:
        return _linked_class_prior(self._loss_class, data)

    def add_arguments_to_parser(self, parser) -> None:  # noqa: D102
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments(
            "data.num_classes", "model.init_args.loss.init_args.num_classes", apply_on="instantiate"
        )
        for name in SIZE_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.link_arguments(
            "model.init_args.embedding_dim", "model.init_args.loss.init_args.embedding_dim", apply_on="parse"
        )
        # the training label distribution (losses built from it: a class prior, class counts)
        parser.link_arguments("data", "model.init_args.loss.init_args.class_counts",
                              compute_fn=self._linked_counts, apply_on="instantiate")
        parser.link_arguments("data", "model.init_args.loss.init_args.class_prior",
                              compute_fn=self._linked_prior, apply_on="instantiate")

    @staticmethod
    def configure_optimizers(lightning_module: Any, optimizer: Any, lr_scheduler: Any = None) -> Any:
        """The optimiser and the scheduler the CLI built (``--optimizer`` / ``--lr_scheduler``): a
        scheduler steps once per optimiser step (``interval="step"``; warmup and decay schedules are
        written per step), ``ReduceLROnPlateau`` once per validation on its ``monitor``; a
        ``total_steps=None`` of the scheduler is filled in from the trainer
        (:func:`lightning_modules.optim.resolve_total_steps`)."""
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        resolve_total_steps(lr_scheduler, getattr(lightning_module, "_trainer", None))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "step"}}

    def _add_configure_optimizers_method_to_model(self, subcommand: Optional[str]) -> None:
        """``--lr_scheduler`` without ``--optimizer`` drives the module's own optimiser (its parameter
        groups, SparseAdam for sparse gradients); Lightning's CLI would ignore it. With
        ``--optimizer`` the CLI builds both, as Lightning does, stepped by :meth:`configure_optimizers`."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = [k for k, (_, link) in parser._optimizers.items() if link == "AUTOMATIC"]
        schedulers = [k for k, (_, link) in parser._lr_schedulers.items() if link == "AUTOMATIC"]
        optimizer_init = self._get(self.config_init, optimizers[0]) if len(optimizers) == 1 else None
        scheduler_init = self._get(self.config_init, schedulers[0]) if len(schedulers) == 1 else None
        if optimizer_init or not scheduler_init:
            return super()._add_configure_optimizers_method_to_model(subcommand)
        from pytorch_lightning.cli import instantiate_class

        own = self.model.configure_optimizers
        step = type(self).configure_optimizers
        owner = type(self.model).__name__

        def configure_optimizers(module: Any) -> Any:
            optimizer = own()
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise ValueError(f"{owner}: --lr_scheduler needs the module's optimiser alone, but its "
                                 f"configure_optimizers returns {type(optimizer).__name__} (it sets a schedule of "
                                 "its own: set its lr_schedule to 'constant', or pass --optimizer too)")
            return step(module, optimizer, instantiate_class(optimizer, scheduler_init))

        self.model.configure_optimizers = MethodType(configure_optimizers, self.model)

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        # validate / test: the MetricsSummary table replaces Lightning's results table by default
        # (``--verbose=true`` still turns it on); were Lightning to rename this hook, the only
        # change would be that its table prints again
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand in ("validate", "test") and "verbose" in self._subcommand_method_arguments.get(subcommand, ()):
            parser.set_defaults(verbose=False)
        return parser

    def instantiate_trainer(self, **kwargs):  # noqa: D102
        trainer = super().instantiate_trainer(**kwargs)
        # Lightning's model summary shows a FLOPs column of zeros (no example input): the same table without it
        from pytorch_lightning.callbacks import ModelSummary, RichModelSummary

        trainer.callbacks = [ParameterSummary(max_depth=cb._max_depth, **cb._summarize_kwargs)
                             if type(cb) in (ModelSummary, RichModelSummary) else cb for cb in trainer.callbacks]
        # the end-of-run table, last in the list so that it prints after the progress bar's teardown
        summaries = [cb for cb in trainer.callbacks if isinstance(cb, MetricsSummary)] or [MetricsSummary()]
        trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, MetricsSummary)] + summaries[:1]
        return trainer

    def before_validate(self) -> None:  # noqa: D102
        _ignore(QUIET_EVAL_WARNINGS)

    def before_test(self) -> None:  # noqa: D102
        _ignore(QUIET_EVAL_WARNINGS)


def _close_process_group() -> None:
    """Leave ``torch.distributed`` cleanly once a multi-process run has finished.

    Lightning's DDP strategy leaves the process group open when ``fit`` returns; if the
    interpreter then exits, the gloo group's worker threads are torn down by static destructors
    while the other rank may still be talking to them, which can abort the process
    ("terminate called without an active exception", exit status -6) after a successful run.
    Every rank waits for the others here and destroys its group before returning.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


class _DropLogLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not str(record.getMessage()).startswith(QUIET_LOG_PREFIXES)
        except Exception:  # pragma: no cover - a record that cannot be formatted is not ours to drop
            return True


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Drop the third-party messages listed in the module docstring while the block runs."""
    from lightning_utilities.core import rank_zero as _rz

    loggers = {logging.getLogger(name) for name in _LIGHTNING_LOGGERS}
    if isinstance(getattr(_rz, "log", None), logging.Logger):
        loggers.add(_rz.log)
    drop = _DropLogLines()
    with warnings.catch_warnings():
        _ignore(QUIET_WARNINGS)
        for logger in loggers:
            logger.addFilter(drop)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(drop)


# -- errors ----------------------------------------------------------------------------------------
def debug_enabled() -> bool:
    """Whether ``$LOSSES_DEBUG`` asks for full tracebacks (any value but empty, 0, false, no, off)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


#: where the project's own exceptions are raised: the losses and lightning_modules packages
_PROJECT_DIRS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (_losses.__file__, __file__))
_ARGPARSE_FILE = os.path.abspath(argparse.__file__)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":')


def _chain(exc: BaseException) -> List[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first (``__cause__``, else ``__context__``)."""
    out: List[BaseException] = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    return out


def _raised_in(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return os.path.abspath(tb[-1].filename) if tb else ""


def _from_project(exc: BaseException) -> bool:
    return _raised_in(exc).startswith(_PROJECT_DIRS)


def _from_parser(exc: BaseException) -> bool:
    where = _raised_in(exc)
    return isinstance(exc, argparse.ArgumentError) or where == _ARGPARSE_FILE or f"{os.sep}jsonargparse{os.sep}" in where


def _text(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:  # str() of a KeyError is the repr of its key
        return str(exc.args[0])
    return str(exc)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def error_message(exc: BaseException) -> str:
    """The one-line message the CLI prints for ``exc`` (without the ``error:`` prefix).

    The innermost exception raised by the project's own code (:mod:`losses`,
    :mod:`lightning_modules`) wins; its message already names the function or class. Failing
    that, the innermost exception that jsonargparse did not raise (e.g. from a user's class or
    from torch), with its type. A pure parsing error (an unknown option, a value of the wrong
    type, an unknown class) is told as the dotted argument it concerns and jsonargparse's
    innermost reason.
    """
    chain = _chain(exc)
    for e in reversed(chain):
        if _from_project(e) and _text(e):
            return _one_line(_text(e))
    for e in reversed(chain):
        if not _from_parser(e) and _text(e):
            return f"{type(e).__name__}: {_one_line(_text(e))}"
    keys: List[str] = []  # the dotted argument, from the "Parser key" messages of nested parsers
    last, nested = None, False
    for e in chain:
        text = _text(e).lstrip("\n")
        m = _PARSER_KEY.match(text)
        if m and (m.group(1) != last or nested):  # each level is reported twice (ArgumentError, TypeError)
            keys.append(("init_args." if nested and keys else "") + m.group(1))
            last, nested = m.group(1), False
        elif text.startswith("Problem with given class_path"):
            nested = True
    reason = _one_line(_text(chain[-1]))
    key = ".".join(keys)
    reason = _explain_parse_error(chain, reason, key)
    if len(keys) > 1 or (keys and not reason.startswith(f'Parser key "{keys[0]}"')):
        reason = _PARSER_KEY.sub("", reason).strip() or reason
        return f"--{key}: {reason}"
    return reason


_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_GIVEN_CLASS = re.compile(r"Problem with given class_path '([^']+)'")
_NOT_A_PATH = re.compile(r"Expected a dot import path string: (\S+)")
_NO_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")


def accepted_arguments(cls: type) -> List[str]:
    """The keyword arguments ``cls(...)`` takes, in signature order (no ``*args`` / ``**kwargs``)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _closest(word: str, choices, cutoff: float = 0.6) -> Optional[str]:
    import difflib

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def _registry_class_path(name: str) -> Optional[str]:
    """``losses.<Module>`` for a registry name whose module the package exports, else ``None``."""
    try:
        module = _losses.get_loss_spec(name).module
    except Exception:
        return None
    return f"losses.{module.__name__}" if getattr(_losses, module.__name__, None) is module else None


def _explain_parse_error(chain: List[BaseException], reason: str, key: str) -> str:
    """jsonargparse's reason, completed where it leaves the user guessing:

    * an argument a class does not take: the arguments it does take, the closest one, and the
      ``--<key>.help <class>`` command that describes them;
    * a registry name (``cross_entropy``) where a class path is expected: the class path to write;
    * a class the package does not have (``losses.CrossEntropyLos``): the closest one it has.
    """
    texts = [_text(e) for e in chain]
    flag = f"--{key}" if key else "--<key>"
    m = _NOT_ACCEPTED.search(reason)
    if m:
        path = next((found[-1] for found in (_GIVEN_CLASS.findall(t) for t in reversed(texts)) if found), None)
        cls = _import_class(path) if path else None
        names = accepted_arguments(cls) if cls is not None else []
        if names:
            bad = m.group(1)
            close = _closest(bad, names)
            hint = f" (did you mean '{close}'?)" if close else ""
            return (f"{path} does not take '{bad}'{hint}; it takes: {', '.join(names)} "
                    f"(`{flag}.help {path}` describes each)")
        return reason
    m = _NOT_A_PATH.search(reason)
    if m:
        value = m.group(1)
        path = _registry_class_path(value)
        if path is not None:
            return (f"'{value}' is a registry name, not a class path: write class_path: {path} "
                    f"(in YAML `class_path: {path}` under the key, on the command line {flag}={path})")
        close = _closest(value, _losses.loss_names())
        close_path = _registry_class_path(close) if close is not None else None
        if close_path is not None:
            return (f"expected a class path such as losses.CrossEntropyLoss, got '{value}' (did you mean "
                    f"class_path: {close_path}, the registry's '{close}'?)")
        return f"expected a class path such as losses.CrossEntropyLoss, got '{value}'"
    m = _NO_ATTRIBUTE.search(reason)
    if m and m.group(1) == "losses":
        close = _closest(m.group(2), [n for n in dir(_losses) if n[:1].isupper()], cutoff=0.8)
        if close is not None:
            return f"{reason} (did you mean losses.{close}?)"
    return reason


def _during_run(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while the subcommand ran (after parsing and instantiation)."""
    return any(frame.name == "_run_subcommand" for e in _chain(exc) for frame in traceback.extract_tb(e.__traceback__))


def _report_error(exc: BaseException, subcommand: Optional[str]) -> int:
    code = 1 if _during_run(exc) else 2
    command = "python -m lightning_modules" + (f" {subcommand}" if subcommand else "")
    if code == 1:
        first = f"{command}: the run failed ({DEBUG_ENV}=1 shows the full traceback)"
    else:
        first = (f"{command}: the arguments were refused ({DEBUG_ENV}=1 shows the full traceback; "
                 f"`{command} --help` lists the options)")
    sys.stdout.flush()
    print(first, file=sys.stderr)
    print(f"error: {error_message(exc)}", file=sys.stderr, flush=True)
    return code


def _parser_kwargs() -> dict:
    """jsonargparse raises instead of printing its usage and exiting, so :func:`main` can report."""
    return {"exit_on_error": False, **{name: {"exit_on_error": False} for name in SUBCOMMANDS}}


def main(args: Optional[List[str]] = None, *, run: bool = True) -> LossCLI:
    """Run the CLI (``args=None`` reads ``sys.argv``); returns the CLI object.

    After a run (``run=True``) under a multi-process strategy, the process group is closed on
    every rank, so the command exits with status 0 instead of racing the group's teardown.
    A failure prints the short ``error:`` form and raises ``SystemExit`` (status 2 before the
    run starts, 1 during it); with ``LOSSES_DEBUG=1`` the original exception propagates.
    """
    argv = list(sys.argv[1:] if args is None else args)
    subcommand = next((a for a in argv if a in SUBCOMMANDS), None) if run else None
    with quiet_third_party():
        try:
            cli = LossCLI(
                model_class=BenchmarkModule,
                datamodule_class=BenchmarkDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                trainer_defaults={"accelerator": "cpu", "devices": 1},
                seed_everything_default=0,
                save_config_kwargs={"overwrite": True},
                parser_kwargs=_parser_kwargs(),
                args=args,
                run=run,
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            if debug_enabled():
                raise
            raise SystemExit(_report_error(exc, subcommand)) from None
    if run:
        _close_process_group()
    return cli

