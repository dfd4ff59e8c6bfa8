"""Grading workers as SLURM jobs (``--slurm``), through dask-jobqueue.

Each SLURM job runs ``cores`` Dask worker processes of one thread each, so it grades ``cores``
submissions at a time; ``jobs`` such jobs are asked for. The workers run this machine's
Python (:data:`sys.executable`), so the course's virtual environment must be on a folder the
compute nodes share (a home folder usually is); every node needs bubblewrap, like this
machine (a worker that cannot start the sandbox refuses to grade, with the install line).
Anything not given here comes from dask-jobqueue's own configuration
(``~/.config/dask/jobqueue.yaml``, section ``jobqueue.slurm``), where a cluster's usual
partition and account may already be set.

On the command line, settings are ``key=value`` pairs separated by commas::

    python -m autograder grade submissions/ --slurm jobs=4,cores=8,partition=short --dry-run

and ``--dry-run`` prints the job script instead of submitting it. From Python::

    >>> settings = Slurm.parse("jobs=4,cores=8,memory=32GB,walltime=02:00:00,partition=short")
    >>> (settings.jobs, settings.cores, settings.partition)
    (4, 8, 'short')
    >>> script = settings.job_script()    # doctest: +SKIP
    >>> # grade(Path("submissions"), workers=Workers(slurm=settings))   # submits 4 jobs, grades, cancels them
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Slurm", "SlurmSettingsError"]


class SlurmSettingsError(ValueError):
    """A ``--slurm`` setting that is not one, or has a value that cannot be used; the message lists the keys."""


@dataclass(frozen=True)
class Slurm:
    """The SLURM jobs grading runs on: ``jobs`` jobs of ``cores`` cores and ``memory`` each, for ``walltime``."""

    jobs: int = 2  # SLURM jobs asked for
    cores: int = 4  # cores per job = worker processes per job = submissions it grades at a time
    memory: str = "16GB"  # memory per job (the kernel, its ranks and the clean re-grade of each submission)
    walltime: str = "01:00:00"  # how long each job may run
    partition: str | None = None  # sbatch -p; None: dask-jobqueue's configuration decides
    account: str | None = None  # sbatch -A; None: dask-jobqueue's configuration decides
    directives: tuple[str, ...] = field(default_factory=tuple)  # more #SBATCH options, e.g. "--qos=normal"

    HELP = ("jobs=N (SLURM jobs, default 2), cores=N (per job: submissions graded at a time, default 4), "
            "memory=SIZE (per job, default 16GB), walltime=HH:MM:SS (default 01:00:00), partition=NAME, "
            "account=NAME, directive=OPTION (an extra #SBATCH option; may be given several times)")

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.cores < 1:
            raise SlurmSettingsError(f"--slurm needs jobs and cores of 1 or more (got jobs={self.jobs}, "
                                     f"cores={self.cores})")

    @classmethod
    def parse(cls, text: str) -> "Slurm":
        """Settings from ``"key=value,key=value"`` (an empty text: every default)."""
        values: dict[str, Any] = {}
        directives: list[str] = []
        known = {f.name: f for f in fields(cls)}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in {*known, "directive"} - {"directives"}:
                raise SlurmSettingsError(f"--slurm: {item!r} is not a setting; use {cls.HELP}")
            if key == "directive":
                directives.append(value.strip())
            elif key in ("jobs", "cores"):
                try:
                    values[key] = int(value)
                except ValueError:
                    raise SlurmSettingsError(f"--slurm: {key} must be a whole number (got {value!r})") from None
            else:
                values[key] = value.strip()
        return cls(**values, directives=tuple(directives))

    def cluster(self) -> Any:
        """A dask-jobqueue ``SLURMCluster`` with these settings; it submits nothing until scaled."""
        from dask_jobqueue import SLURMCluster

        from .cluster import DASK_ENV, configure

        configure()
        options: dict[str, Any] = {}
        if self.partition:
            options["queue"] = self.partition
        if self.account:
            options["account"] = self.account
        return SLURMCluster(
            job_name="course-grading", cores=self.cores, processes=self.cores, memory=self.memory, walltime=self.walltime,
            python=sys.executable, job_extra_directives=list(self.directives),
            job_script_prologue=[f"export {key}={value}" for key, value in sorted(DASK_ENV.items())],
            **options)

    def job_script(self) -> str:
        """The job script each of the ``jobs`` SLURM jobs would run (nothing is submitted)."""
        cluster = self.cluster()
        try:
            return cluster.job_script()
        finally:
            cluster.close()

    def describe(self) -> str:
        where = ", ".join(part for part in (f"partition {self.partition}" if self.partition else "",
                                            f"account {self.account}" if self.account else "") if part)
        return (f"{self.jobs} SLURM job{'s' if self.jobs != 1 else ''} of {self.cores} cores and {self.memory} "
                f"for {self.walltime}" + (f" ({where})" if where else ""))
