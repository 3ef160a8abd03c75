"""Each rank's heartbeat in a job with spare nodes: ``beat-R.json`` in the attempt's directory (`hpc.node.attempt`),
rewritten whole every ``BEAT_S`` by a thread of its own and at every change of phase, so the restart supervisor sees a
hang in seconds (`hpc.node.hang_deadlines`) instead of at the collective timeout.

A beat says the rank's phase (``first step``: the first step of the start, compilation included; ``step``; ``save``;
``eval``), the step, since when it is in that phase (``since``), when the thread last ran (``alive``: a process
stopped, holding the GIL or gone stops it), and what the rank measured: its recent step times and its longest save
and evaluation. Outside a job with spare nodes it writes nothing.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Mapping, Optional

from hpc.node.attempt import attempt_dir, write_json
from hpc.node.slurm_env import node_name

FIRST_STEP, STEP, SAVE, EVAL = "first step", "step", "save", "eval"
BEAT_S = 1.0  # how often the thread rewrites the beat
RECENT_STEPS = 20  # step times a beat carries


class Heartbeat:
    def __init__(self, rank: int, environ: Mapping[str, str] = os.environ):
        directory = attempt_dir(environ)
        self.path = directory / f"beat-{rank}.json" if directory is not None else None
        self.data: dict = {"rank": rank, "node": node_name(environ), "phase": FIRST_STEP, "step": None}
        self.data["since"] = time.time()
        self.step_s: deque[float] = deque(maxlen=RECENT_STEPS)
        self.longest = {SAVE: 0.0, EVAL: 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if self.path is not None:
            self._write()
            self._thread = threading.Thread(target=self._run, name="hpc-heartbeat", daemon=True)
            self._thread.start()

    def enter(self, phase: str, step: Optional[int]) -> None:
        """This rank enters ``phase`` at ``step``; the phase it leaves is measured."""
        if self.path is None:
            return
        now = time.time()
        with self._lock:
            was, spent = self.data["phase"], now - self.data["since"]
            if was == STEP:
                self.step_s.append(spent)
            elif was in self.longest:
                self.longest[was] = max(self.longest[was], spent)
            self.data.update(phase=phase, step=step, since=now)
        self._write()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self._write()

    def _write(self) -> None:
        with self._lock:  # one writer at a time: the thread and the phase changes share the temporary file
            data = {
                **self.data,
                "alive": time.time(),
                "step_s": [round(s, 4) for s in self.step_s],
                "save_s": round(self.longest[SAVE], 3),
                "eval_s": round(self.longest[EVAL], 3),
            }
            try:
                write_json(self.path, data)
            except OSError:  # the beat is for the supervisor; training goes on without it
                pass
