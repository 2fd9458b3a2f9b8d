# gdb: hide iprobe's return trampolines from backtraces.
#
#   (gdb) source <iprobe>/share/iprobe/gdb/iprobe.py     # or scripts/gdb/iprobe.py in a checkout
#
# gdb already unwinds through a function whose return iprobe hooked (the
# trampolines carry CFI that names the real caller); each such frame is then
# followed by one of `iprobe_rt_return_trampolines`.  This frame filter leaves
# those out, so `bt` shows the program's own frames only.  `bt -no-filters`
# shows them again.
import gdb
from gdb.FrameDecorator import FrameDecorator  # noqa: F401 (the filter yields gdb's own decorators)

TRAMPOLINES = "iprobe_rt_return_trampolines"


def _is_trampoline(decorator):
    name = decorator.function()
    if isinstance(name, int):
        symbol = gdb.progspaces()[0].block_for_pc(name) if name else None
        name = symbol.function.name if symbol is not None and symbol.function is not None else None
    return isinstance(name, str) and name.startswith(TRAMPOLINES)


class HideReturnTrampolines:
    def __init__(self):
        self.name = "iprobe-return-trampolines"
        self.priority = 100
        self.enabled = True
        gdb.frame_filters[self.name] = self

    def filter(self, frames):
        return (frame for frame in frames if not _is_trampoline(frame))


HideReturnTrampolines()
