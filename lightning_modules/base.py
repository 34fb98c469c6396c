"""Shared LightningModule / DataModule machinery for the benchmarks."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from typing import Any, ClassVar, Dict, Iterator, Mapping, MutableMapping, Optional, Tuple

import pytorch_lightning as pl
import torch
# The hyperparameters LightningCLI hands to the module it builds (read by save_hyperparameters).
from pytorch_lightning.core.mixins.hparams_mixin import _given_hyperparameters
from torch import nn

from .optim import build_optimizer
from .routing import LossRoute, ddp_ignored_parameter_names, loss_route


@contextlib.contextmanager
def seeded_init(init_seed: Optional[int]) -> Iterator[None]:
    """Build the weights created inside from ``torch.manual_seed(init_seed)``, with the global CPU
    RNG restored afterwards, so that the arms of a paired comparison start from the same weights;
    ``None``: the global RNG as it is (nothing forked or restored)."""
    with torch.random.fork_rng(devices=[], enabled=init_seed is not None):
        if init_seed is not None:
            torch.manual_seed(int(init_seed))
        yield


def _import_class(path: str) -> Optional[type]:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


def _copy_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``config`` with every nested mapping copied (values shared), so fixing it changes no caller's dict."""
    return {k: _copy_config(v) if isinstance(v, Mapping) else v for k, v in config.items()}


def _fix_config(config: MutableMapping[str, Any], cls: type, owner: Any) -> None:
    """Make ``config`` (constructor arguments of ``cls``) re-instantiable: drop keys that ``cls``
    does not accept, add accepted ones that links filled in but the dump lost, reading them
    from the built object ``owner`` (modules keep their hyperparameters as attributes), and
    recurse into nested ``{"class_path", "init_args"}`` entries. Private ``_`` keys stay."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return
    named = {k: p for k, p in params.items() if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for key in [k for k in config if not k.startswith("_") and k not in named]:
            del config[key]
    if owner is not None:
        for key in named:
            if key not in config and hasattr(owner, key) and _plain(getattr(owner, key)):
                value = getattr(owner, key)
                config[key] = list(value) if isinstance(value, tuple) else value
    for key, value in list(config.items()):
        if isinstance(value, MutableMapping) and isinstance(value.get("class_path"), str):
            sub = _import_class(value["class_path"])
            if sub is not None:
                if not isinstance(value.get("init_args"), MutableMapping):
                    value["init_args"] = {}
                _fix_config(value["init_args"], sub, getattr(owner, key, None) if owner is not None else None)


class IndexDataset(torch.utils.data.Dataset):
    """The positions ``0 .. n - 1`` as a map-style dataset: the loaders of the recommendation and
    retrieval DataModules batch positions and let their collate functions build the batches."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class WorkerGenerator:
    """The random stream of a collate function, safe with ``DataLoader(num_workers > 0)``.

    In the main process (``num_workers=0``) it is one ``torch.Generator`` seeded with ``seed``.
    A generator stored on the collate object would be copied into every worker process in the
    same state, at every epoch (workers are re-created per epoch), so all workers would draw the
    same negatives, and the same again each epoch. Inside a worker the stream is therefore seeded
    from ``seed`` and the worker's ``torch.initial_seed()``, which the DataLoader sets to its
    per-epoch base seed (drawn from the loader's seeded generator) plus the worker id: distinct
    per worker and per epoch, and reproducible for a given seed and worker count."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._main = torch.Generator().manual_seed(self.seed)
        self._worker_key: Optional[int] = None
        self._worker: Optional[torch.Generator] = None

    def get(self) -> torch.Generator:
        if torch.utils.data.get_worker_info() is None:
            return self._main
        key = torch.initial_seed()
        if key != self._worker_key:
            self._worker_key = key
            self._worker = torch.Generator().manual_seed((self.seed * 1_000_003 + key) % (1 << 63))
        return self._worker


def check_test_seed(owner: str, test_seed, what: str) -> Optional[int]:
    """``test_seed`` of a DataModule whose test split can be fixed across seeds: ``None`` or an
    integer (``bool`` refused), else a ``ValueError`` naming ``owner``; ``what`` names what ``None``
    draws from ``seed`` instead (e.g. "the test queries")."""
    if test_seed is not None and (isinstance(test_seed, bool) or not isinstance(test_seed, int)):
        raise ValueError(f"{owner}: test_seed must be an integer or None (got {test_seed!r}); None draws {what} "
                         "from seed (a new one per seed)")
    return None if test_seed is None else int(test_seed)


def split_fingerprint(indices) -> str:
    """The first 12 hex digits of the SHA-256 of the sorted indices (int64, little-endian): a short
    name of a split, equal for two runs exactly when they evaluated on the same examples."""
    import hashlib

    import numpy as np

    arr = np.sort(np.asarray(torch.as_tensor(indices).reshape(-1).cpu(), dtype="<i8"))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:12]



class BenchmarkDataModule(pl.LightningDataModule):
    """Base of every benchmark DataModule: the sizes models need, linked by the CLI.

    Subclasses set the sizes that apply in ``__init__`` (they must be known before the model is
    built, since the CLI links them into the model's and the loss's constructors); the others
    stay 0.
    """

    num_classes: int = 0  #: output classes (digits: 10, segmentation: 11, items as classes: 1682)
    num_users: int = 0  #: recommendation: users (query rows)
    num_items: int = 0  #: recommendation / retrieval: items or corpus documents
    input_dim: int = 0  #: width of precomputed input features (e.g. 384 for cached MiniLM)
    in_chans: int = 0  #: image channels


def log_data_meta(module: pl.LightningModule) -> None:
    """Log the DataModule's ``meta`` (data set counts, ``sys.version``: what a result must be
    reported with) as ``data/*`` hyperparameters of the run's logger, when both exist."""
    trainer = getattr(module, "_trainer", None)
    meta = getattr(getattr(trainer, "datamodule", None), "meta", None)
    if not meta or module.logger is None:
        return
    try:
        module.logger.log_hyperparams({f"data/{k}": v for k, v in meta.items()})
    except NotImplementedError:  # loggers without hyperparameters
        pass


class BenchmarkModule(pl.LightningModule):
    """Base of every benchmark LightningModule: hyperparameters, loss route, evaluation hooks,
    optimiser and DDP-ignored loss parameters.

    How to write a new benchmark module:

    * Subclass ``BenchmarkModule``, give ``__init__`` explicit, type-hinted arguments (the CLI
      builds them from YAML) with ``loss`` first, and call ``super().__init__(loss, lr=lr,
      weight_decay=weight_decay)`` first thing.
    * Declare what the module trains on its own in the class body: :attr:`loss_kinds` (the
      :class:`losses.InputKind` values it routes), :attr:`loss_task` and :attr:`loss_hint` (the
      message of a loss it cannot train with), :attr:`loss_example` (named when ``loss`` is not an
      ``nn.Module``). ``super().__init__`` routes the loss by its registry declaration and checks
      it (``"<ClassName>: ..."`` errors, :meth:`check_route`); the result is ``self.route``
      (:class:`~lightning_modules.routing.LossRoute`). A module with other rules overrides
      :meth:`check_route`. The module still assigns ``self.loss = loss`` itself, where its
      sub-modules should be registered.
    * Do not call ``save_hyperparameters``: once the outermost ``__init__`` has returned (also for
      a subclass of a subclass, exactly once), the base saves the constructor arguments (minus
      :attr:`hparams_ignore`) and makes them re-instantiable after the CLI's size links (see
      :meth:`_save_benchmark_hparams`), so ``load_from_checkpoint`` and ``validate --ckpt_path``
      rebuild the module. Keep each size / plain hyperparameter also as an attribute of its name
      (``self.num_classes = num_classes``) where a link may fill it in.
    * Implement ``training_step``, and for validation and test ``_eval_step(stage, batch,
      batch_idx, dataloader_idx)`` and, where a stage needs a summary at its end,
      ``_eval_epoch_end(stage)``; ``stage`` is ``"val"`` or ``"test"``, the prefix of the logged
      names (``f"{stage}/top1"``). ``validation_step`` / ``test_step`` and
      ``on_validation_epoch_end`` / ``on_test_epoch_end`` are defined here and dispatch to them.
    * The DataModule's ``meta`` (data set counts, ``sys.version``), where it has one, is logged
      as ``data/*`` hyperparameters at the start of ``fit`` and ``test`` (:func:`log_data_meta`);
      a subclass that overrides ``on_fit_start`` / ``on_test_start`` calls ``super()`` first.
    * Keep per-stage metric objects in ``nn.ModuleDict``s keyed by stage
      (``self.eval_metrics = nn.ModuleDict({"val": ..., "test": ...})``), so they move with the
      module and each stage has its own state.
    """

    #: The input kinds (:class:`losses.InputKind`) the module routes as its main loss; the
    #: loss must also train alone (:meth:`~lightning_modules.routing.LossRoute.require_main`).
    loss_kinds: ClassVar[Tuple[str, ...]] = ()
    #: What the loss would train, for the error message (e.g. ``"a classifier"``).
    loss_task: ClassVar[str] = "a benchmark model"
    #: What to use instead, for the error message.
    loss_hint: ClassVar[str] = "pass a registered loss that this module routes"
    #: A loss to name when ``loss`` is not an ``nn.Module`` (``TypeError``); ``None``: the
    #: routing's own error (``loss_route``).
    loss_example: ClassVar[Optional[str]] = None
    #: Constructor arguments left out of the saved hyperparameters.
    hparams_ignore: ClassVar[Tuple[str, ...]] = ()
    #: The per-item test records being collected (:class:`lightning_modules.records.ItemRecords`),
    #: set by :class:`lightning_modules.records.TestItemRecorder` for the test stage only; ``None``
    #: (always, unless that callback is attached): nothing per item is computed.
    item_records: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_benchmark_init", False):
            cls.__init__ = _wrap_init(init)

    def __init__(self, loss: nn.Module, *, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        super().__init__()
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        owner = type(self).__name__
        if self.loss_example is not None and not isinstance(loss, nn.Module):
            raise TypeError(f"{owner}: loss must be an nn.Module (got {type(loss).__name__}); "
                            f"pass e.g. {self.loss_example}")
        self.route: LossRoute = loss_route(loss)
        self.check_route(self.route)

    def check_route(self, route: LossRoute) -> None:
        """Raise ``ValueError("<ClassName>: ...")`` unless this module can train with a loss of
        ``route``; by default :attr:`loss_kinds` and a loss that trains alone."""
        route.require_main(type(self).__name__, self.loss_kinds, task=self.loss_task, hint=self.loss_hint)

    def _save_benchmark_hparams(self, init_args: Dict[str, Any]) -> None:
        """Save the hyperparameters once the module is built (called after the outermost ``__init__``).

        ``init_args`` are the constructor arguments (every level of the class hierarchy, the
        outermost winning); under ``LightningCLI`` its own record of the configuration is used
        instead, as ``save_hyperparameters`` does. That record lists every applied size link, also
        for arguments a class does not take (``num_users`` for a vision model, ``num_classes`` for a
        loss without a head), and lacks parse-time link targets (the loss's ``embedding_dim``), so
        ``validate --ckpt_path`` and ``load_from_checkpoint`` could not re-parse it: before saving,
        keys a class does not accept are dropped and missing accepted ones are read from the built
        module and its sub-modules (``_fix_config``).
        """
        given = _given_hyperparameters.get()
        hparams = _copy_config(given if given is not None else init_args)
        _fix_config(hparams, type(self), self)
        token = _given_hyperparameters.set(hparams)  # save_hyperparameters takes them as given
        try:
            self.save_hyperparameters(ignore=list(self.hparams_ignore) or None)
        finally:
            _given_hyperparameters.reset(token)

    # -- evaluation: one dispatch for validation and test ------------------------------------------
    def _eval_step(self, stage: str, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """One evaluation batch of ``stage`` (``"val"`` or ``"test"``); subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__}: implement _eval_step(stage, batch, batch_idx, "
                                  "dataloader_idx) to evaluate (BenchmarkModule docstring)")

    def _eval_epoch_end(self, stage: str) -> None:
        """The end of an evaluation epoch of ``stage``; nothing by default."""

    def _item_records(self, stage: str) -> Any:
        """The test records to add rows to, when :class:`~lightning_modules.records.TestItemRecorder`
        is attached and ``stage`` is ``"test"``; else ``None`` (the default: record nothing)."""
        return self.item_records if stage == "test" else None

    def item_record_spec(self) -> Dict[str, Any]:
        """What :class:`~lightning_modules.records.TestItemRecorder` writes in the records' header:
        ``{"kind": ..., "tables": {table: {"columns": {name: description}}}, "metrics": {"test/<name>":
        {"table", "agg", "columns", ...}}, "notes": ...}``; each module that records implements it."""
        raise NotImplementedError(f"{type(self).__name__} does not record per-item test records")

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("val", batch, batch_idx, dataloader_idx)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step("test", batch, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    # -- training machinery -------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        log_data_meta(self)  # data set counts and sys.version go with every result

    def on_test_start(self) -> None:
        log_data_meta(self)

    def setup(self, stage: str) -> None:
        # Parameters a loss shards across ranks (Partial FC centres) must never be averaged by
        # DDP; Lightning's DDP strategy reads this attribute when it wraps the module.
        names = ddp_ignored_parameter_names(self)
        if names:
            self._ddp_params_and_buffers_to_ignore = list(names)

    def configure_optimizers(self) -> Any:
        """AdamW over every parameter; parameters whose loss gives them a sparse gradient
        (``sparse_grad=True``) get SparseAdam instead (``lightning_modules.optim``)."""
        return build_optimizer(self, [{"params": list(self.parameters())}], lr=self.lr,
                               weight_decay=self.weight_decay)


_PENDING = "_benchmark_pending_init_args"  # per instance, while its __init__ chain runs


def _bound_init_args(signature: inspect.Signature, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """The arguments of one ``__init__`` call by name, defaults filled in, ``**kwargs`` spread and
    ``self`` / ``*args`` left out (what ``save_hyperparameters`` collects from an ``__init__`` frame)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    out: Dict[str, Any] = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        kind = signature.parameters[name].kind
        if i == 0 or kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


def _wrap_init(init):
    """``init`` recording its arguments; the outermost ``__init__`` of an instance saves the
    hyperparameters once the whole chain has returned (``BenchmarkModule.__init_subclass__``)."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        state = self.__dict__  # nn.Module.__init__ may not have run yet: no __setattr__
        outermost = _PENDING not in state
        try:
            level = _bound_init_args(signature, (self, *args), kwargs)
        except TypeError:  # a wrong call: let the constructor itself say so
            level = {}
        if outermost:
            state[_PENDING] = []
        state[_PENDING].append(level)
        try:
            init(self, *args, **kwargs)
        finally:
            if outermost:
                levels = state.pop(_PENDING)
        if outermost:
            init_args: Dict[str, Any] = {}
            for level in reversed(levels):  # the innermost first: the outermost call wins
                init_args.update(level)
            self._save_benchmark_hparams(init_args)

    __init__.__signature__ = signature  # getfullargspec (load_from_checkpoint) reads the real one
    __init__._benchmark_init = True
    return __init__
