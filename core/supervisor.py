"""Process supervision for ``manage.py serve`` and ``manage.py worker``.

Each program runs in its own process group, so stopping it reaches its own children
(gunicorn's workers, qcluster's sentinel, pusher, monitor and workers); each gets
``PR_SET_PDEATHSIG``, so it dies with a supervisor that was killed -9. A program that
exits on its own, or that its ``check`` declares stuck, is restarted with exponential
backoff and logged. On any exit of the supervisor (Ctrl-C, SIGTERM, an exception)
every group is stopped: SIGTERM, then SIGKILL after ``stop_timeout``.

This module must not import Django: ``Program`` hooks that need it import it themselves.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

logger = logging.getLogger("core.supervisor")

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: int | None = None) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux).

    Called between fork and exec (``preexec_fn``) or right after a fork: a parent
    that died before the call is caught by comparing ``getppid()``. The setting is
    kept across ``exec`` but not across ``fork``, so each generation sets its own.
    """
    if _libc is None:
        return
    _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Program:
    """One supervised command. Subclasses override the hooks."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stop_timeout: float = 20.0,
        parent_death_signal: int = signal.SIGTERM,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.stop_timeout = stop_timeout
        self.parent_death_signal = parent_death_signal
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restart_at = 0.0
        self.failures = 0
        self.restarts = 0

    # --- hooks -----------------------------------------------------------------------
    def before_start(self) -> dict[str, str]:
        """Extra environment for the next start."""
        return {}

    def after_stop(self) -> None:
        """Runs once the program's whole process group is gone."""

    def check(self) -> str | None:
        """Called every tick while the program runs: a reason to restart it, or None."""
        return None

    def close(self) -> None:
        """Runs once, when the supervisor exits (after the last ``after_stop``)."""

    # --- mechanics -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env.update(self.before_start())
        parent = os.getpid()
        sig = self.parent_death_signal
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            start_new_session=True,  # own process group; no terminal SIGINT
            preexec_fn=lambda: die_with_parent(sig, parent),
        )
        self.started_at = time.monotonic()
        logger.info("started %s (pid %s)", self.name, self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop the program: ``sig`` to it (it stops its own children gracefully: the
        cluster lets running tasks finish), then SIGKILL to whatever is left of its
        group after ``stop_timeout``. SIGKILL goes to the whole group at once."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session made the child its group's leader
        if sig == signal.SIGKILL:
            kill_group(pgid, sig)
        elif proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs; killing it", self.name, self.stop_timeout)
        self._kill_leftovers(pgid)
        self.proc = None
        self.after_stop()
        return proc.returncode

    def reap(self) -> int | None:
        """The group leader exited: kill what is left of its group."""
        proc = self.proc
        if proc is None:
            return None
        self._kill_leftovers(proc.pid)
        self.proc = None
        self.after_stop()
        return proc.returncode

    def _kill_leftovers(self, pgid: int) -> None:
        deadline = time.monotonic() + max(5.0, self.stop_timeout)
        members = group_members(pgid)
        while members and time.monotonic() < deadline:
            kill_group(pgid, signal.SIGKILL)
            time.sleep(0.05)
            members = group_members(pgid)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if members:
            logger.error("%s: processes %s survived SIGKILL", self.name, [p.pid for p in members])


class Supervisor:
    """Run ``programs`` until SIGINT/SIGTERM; restart any that exits or gets stuck.

    Backoff: ``backoff_initial`` doubled per consecutive failure up to
    ``backoff_max``; a program that ran ``stable_after`` seconds starts over at
    ``backoff_initial``. ``periodic`` callbacks run every tick (e.g. restarting the
    embedded database).
    """

    def __init__(
        self,
        programs: Sequence[Program],
        *,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        tick: float = 0.2,
        periodic: Sequence[Callable[[], Any]] = (),
    ) -> None:
        self.programs = list(programs)
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.tick = tick
        self.periodic = list(periodic)
        self._stopping = False

    def request_stop(self, signum: int = 0, frame: Any = None) -> None:
        self._stopping = True

    def run(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        try:
            for program in self.programs:
                program.start()
            while not self._stopping:
                self._step()
                time.sleep(self.tick)
        finally:
            # Reverse order: the worker before the web server that queues its work.
            for program in reversed(self.programs):
                program.stop()
                program.close()
            self._reap_orphans()

    def _step(self) -> None:
        now = time.monotonic()
        for program in self.programs:
            if self._stopping:
                return
            if program.proc is None:
                if now >= program.restart_at:
                    program.restarts += 1
                    program.start()
                continue
            code = program.proc.poll()
            if code is not None:
                ran = now - program.started_at
                program.reap()
                self._schedule_restart(program, ran, f"exited with code {code}")
                continue
            reason = self._check(program)
            if reason:
                ran = now - program.started_at
                logger.error("%s is stuck: %s; restarting it", program.name, reason)
                program.stop(signal.SIGKILL)
                self._schedule_restart(program, ran, "stuck", immediately=True)
        for callback in self.periodic:
            try:
                callback()
            except Exception:  # noqa: BLE001 - supervision goes on
                logger.exception("periodic check failed")
        self._reap_orphans()

    def _check(self, program: Program) -> str | None:
        try:
            return program.check()
        except Exception:  # noqa: BLE001 - a failing check must not stop supervision
            logger.exception("%s: check failed", program.name)
            return None

    def _schedule_restart(
        self, program: Program, ran: float, why: str, *, immediately: bool = False
    ) -> None:
        if immediately:  # we stopped it: not a crash loop to slow down
            delay = 0.0
        else:
            program.failures = 0 if ran >= self.stable_after else program.failures + 1
            delay = min(self.backoff_max, self.backoff_initial * 2 ** max(0, program.failures - 1))
        program.restart_at = time.monotonic() + delay
        logger.error(
            "%s %s after %.1fs; restarting in %.1fs (restart %d)",
            program.name,
            why,
            ran,
            delay,
            program.restarts + 1,
        )

    def _reap_orphans(self) -> None:
        """Collect exited children we did not start (orphans re-parented to us when
        we run as PID 1 in a container); Popen reaps its own."""
        ours = {p.proc.pid for p in self.programs if p.proc is not None}
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for child in children:
            if child.pid in ours:
                continue
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                continue
