"""The options of one training run that every application takes (docs/design.md, 10.
Training): where the data and the model folder are, and the :class:`~unroll.train.trainer.
Trainer`'s own settings. An application's options are a dataclass that extends
:class:`RunOptions` with its own fields (and its own default ``epochs``), so the fields the
command lines share are stated once, and so is the Trainer they make.

>>> from dataclasses import dataclass
>>> @dataclass
... class CopyOptions(RunOptions):
...     epochs: int = 3
...     width: int = 8
>>> opts = CopyOptions(data=None, model_dir="runs/copy", lr=0.01)
>>> trainer = opts.trainer(app=None, average=None, curve=False)
>>> opts.width, trainer.epochs, trainer.given
(8, 3, {'--lr': 0.01})
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from unroll.train.trainer import Trainer

__all__ = ["RunOptions"]


@dataclass
class RunOptions:
    """What to train on, where, and how: the fields every application's training takes.

    ``data`` is the folder of the data files; ``model_dir`` the model folder; ``epochs``,
    ``max_minutes``, ``seed``, ``resume``, ``overwrite``, ``skip_bad_batches``, ``device``
    and ``quiet`` are the :class:`~unroll.train.trainer.Trainer`'s (``seed`` None: 0, or on
    ``resume`` the folder's); ``lr`` the learning rate (None: the application's default, or
    on ``resume`` the folder's); ``limit`` the sentences read of each file (None: all);
    ``sizes`` the application's config fields to set on a fresh run (a resumed run keeps
    the folder's, and a size given that differs from it is an error naming both).
    """

    data: Path | None
    model_dir: Path | None
    epochs: int = 20
    max_minutes: float | None = None  # None: no time limit; else stop before the next epoch
    lr: float | None = None
    seed: int | None = None
    limit: int | None = None
    resume: bool = False
    overwrite: bool = False
    skip_bad_batches: int = 0
    device: str = "cpu"
    quiet: bool = False
    sizes: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, args, **values):
        """The options of the parsed command line ``args`` (:mod:`unroll.tools.app_cli`'s
        options, named as these fields are), ``values`` for the fields named otherwise or
        worked out (the data folder once fetched, the sizes)."""
        named = {f.name: getattr(args, f.name) for f in fields(cls)
                 if f.name not in values and hasattr(args, f.name)}
        return cls(**named, **values)

    def trainer(self, app, given: dict | None = None, **settings) -> Trainer:
        """The :class:`~unroll.train.trainer.Trainer` of ``app`` that these options set;
        ``given`` the application's recorded options as given (``{"--lr-decay": ...}``)
        beside ``--lr``, which every run records; ``settings`` the Trainer's other keyword
        arguments (``average``)."""
        return Trainer(app, self.model_dir, epochs=self.epochs, seed=self.seed,
                       resume=self.resume, overwrite=self.overwrite,
                       max_minutes=self.max_minutes, skip_bad_batches=self.skip_bad_batches,
                       quiet=self.quiet, device=self.device,
                       given={"--lr": self.lr, **(given or {})}, **settings)
