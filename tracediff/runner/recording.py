"""A recording in this process, and how it starts: the output path settled and checked,
the manifest begun, the writer opened, the garbage collector's threshold raised, the
captures armed. Shared by `tracediff record` (script.py) and `tracediff.record()`; how it
stops is closing.py.
"""

import gc
import os

from ..capture import RecordOptions, Session, start_captures
from ..errors import TraceError
from ..trace.manifest import base_manifest
from ..trace.writer import TraceWriter
from .closing import Closing
from .output import check_output_path, distributed_rank, output_path_for

# the tracediff package's folder: its frames are never the script's (the capture's
# sources, the script's traceback)
TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recording(Closing):
    """One recording in the current process: writer, session, captures, and their clean
    teardown. Shared by `tracediff record` (`record_script`) and `tracediff.record()`.

    `start()` opens the trace and arms the captures (a framework already imported is
    captured at once, one imported later when it is imported); `stop(end)` uninstalls
    them, completes the manifest with `end` ({"status", "exit_code", ...}) and each
    framework's configuration, and closes the trace. `stop` never raises over a capture's
    clean-up error (it is recorded in the manifest instead) and is idempotent (closing.py).
    """

    def __init__(self, output, options=None, frameworks=("jax", "torch"), script=None,
                 argv=None, tool="tracediff record", script_dir=None):
        self.output = output
        self.options = options or RecordOptions()
        self.frameworks = tuple(frameworks or ("jax", "torch"))
        self.script, self.argv, self.tool = script, argv, tool
        self.script_dir = script_dir or (os.path.dirname(script) if script else None)
        self.writer = self.session = self.watcher = None
        self.incomplete = None   # why a trace whose recording stopped early does not open
        self.signals_taken = []  # signals the script's own handlers took (term_watch)
        self._old_gc = None
        self._stopped = False
        self.pid = os.getpid()

    def start(self):
        self.pid = os.getpid()
        # absolute: the script may chdir, and the close-time rewrite and the size printed
        # must be the trace's, never a file of the same name in the script's new folder
        self.output = os.path.abspath(output_path_for(self.output))
        check_output_path(self.output)
        manifest = base_manifest(self.script, self.argv,
                                 {"tool": self.tool, **self.options.as_dict()})
        manifest["distributed"] = distributed_rank()
        try:
            self.writer = TraceWriter(self.output, manifest,
                                      codec=self.options.codec)
        except OSError as exc:
            raise TraceError(f"cannot write {self.output}: {exc.strerror or exc}") from None
        # a hash chosen with --hash applies to every framework's values (`auto` is chosen
        # by the JAX capture per backend, capture/jax/value_store.py; else xxh3_64)
        if getattr(self.options, "hash", "auto") != "auto":
            self.writer.use_hash(self.options.hash)
        # --level stats/calls store hash + statistics instead of bytes; --max-bytes caps bytes
        self.writer.level = "full" if self.options.level == "full" else "stats"
        self.writer.max_bytes = self.options.max_bytes
        self.session = Session(self.writer, self.options, tool_dirs=(TOOL_DIR,))
        self.session.script_dir = self.script_dir
        # The op log grows large; generation-0 collections over it cost more than recording.
        self._old_gc = gc.get_threshold()
        gc.set_threshold(100_000, 50, 100)
        try:
            self.watcher = start_captures(self.session, self.frameworks)
        except BaseException:
            self.stop({"status": "capture failed to start", "exit_code": 1})
            raise
        return self
