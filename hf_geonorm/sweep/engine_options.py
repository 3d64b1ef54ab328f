"""What ``hf-geonorm sweep`` takes to train several runs at once (``EngineOptions``): on the devices of this machine
(``--workers``, ``--devices``) and on many machines sharing one database (``--storage``, ``--study``). Declared as
``SweepOptions`` is, so that the command line generates its options from here; like it, this imports nothing but the
standard library and ``declarations``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._plumbing.declarations import OptionError, check_limits

TAKEOVER_AFTER = 300  # seconds a machine's run may go without a heartbeat before another machine takes it over


@dataclass
class EngineOptions:
    """Where the runs of a sweep train: one at a time in this process (the default), on N worker processes of this
    machine, or on every machine that runs the same sweep against one ``--storage``."""

    workers: int | None = field(default=None, metadata={"help": (
        "Runs trained at once on this machine, each in its own process: on its own accelerator (in turn over "
        "--devices) or, without one, on its own share of the CPU cores."), "ge": 1, "le": 256, "metavar": "N",
        "default_text": "one per --devices, else 1 (one run at a time, in this process)"})  # fmt: skip
    devices: str | None = field(default=None, metadata={"help": (
        "Accelerators the workers train on, a comma list of CUDA indexes, or auto: every visible one (none "
        "visible: the CPU)."), "metavar": "LIST",
        "default_text": "every visible accelerator when --workers is given"})  # fmt: skip
    storage: str | None = field(default=None, metadata={"help": (
        "A PostgreSQL database shared by every machine of the sweep (postgresql://USER:PASSWORD@HOST:PORT/DB): each "
        "machine running the same command takes the next run; needs pip install 'hf-geonorm[distributed]'."),
        "metavar": "URL", "default_text": "none: this machine's journal alone"})  # fmt: skip
    study: str = field(default="hf-geonorm-sweep", metadata={"help": (
        "The sweep's name in --storage (one database holds many sweeps)."), "metavar": "NAME"})
    takeover_after: int = field(default=TAKEOVER_AFTER, metadata={"help": (
        "With --storage: seconds a machine's run may go without a heartbeat (one every fifth of it) before another "
        "machine takes the run over (its machine died) and the database may be unreachable before a machine gives "
        "up."), "ge": 2, "le": 86_400, "metavar": "SECONDS"})  # fmt: skip

    @property
    def parallel(self) -> bool:
        """Whether the sweep runs on worker processes (``engine``), not one run after the other in this process."""
        return (self.workers or 1) > 1 or self.devices is not None or self.storage is not None

    def validate(self) -> EngineOptions:
        check_limits(self)
        if self.devices is not None and not self.devices.strip():
            raise OptionError("--devices is empty; give CUDA indexes (0,1) or auto")
        if self.storage is not None and not self.study.strip():
            raise OptionError("--study is empty; give the sweep's name in --storage")
        return self
