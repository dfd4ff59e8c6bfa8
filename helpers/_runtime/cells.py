"""Notebook cells' source lines and names, for tracebacks that show them in ranks and in the notebook.

Ranks are forked from the factory, which never saw the notebook's cells: :func:`kernel_sources`
collects the lines of code typed in cells, which every new group takes along, and
:func:`cache_source` registers the source of a ``%%distributed`` cell so that a traceback
names it ``Cell In[N]`` with the number the notebook shows (:func:`cell_label`,
:func:`relabel_traceback`).

    >>> name = cache_source("x = 1\\n")
    >>> kernel_sources()[name]
    ['x = 1\\n']
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["kernel_sources", "cache_source", "running_cell_number", "cell_label", "relabel_traceback"]


def kernel_sources(limit: int = 4 << 20) -> dict[str, list[str]]:
    """Source lines of code typed in notebook cells, so ranks can show them in tracebacks."""
    import linecache

    out, size = {}, 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is None and isinstance(entry[2], list):
            size += entry[0] or 0
            if size > limit:
                break
            out[filename] = entry[2]
    return out


def cache_source(source: str) -> str:
    """Register a cell's source so tracebacks can show its lines, as ``Cell In[N]`` with the
    number the notebook shows for the cell that is running."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.compile.cache(source, running_cell_number(shell))
    except Exception:  # noqa: BLE001 - outside IPython
        pass
    import linecache

    name = f"<distributed-{abs(hash(source)) & 0xFFFFFFFF:x}>"
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return name


def running_cell_number(shell: Any) -> int:
    """The number of the notebook cell running now, as the notebook shows it.

    That is the number IPython filed the running cell's code under; its
    ``execution_count`` has already moved on to the next cell by the time a cell magic
    runs (in current IPython versions), which made reports say ``Cell In[5]`` for cell [4].
    """
    numbers = shell.compile._filename_map
    frame = sys._getframe(1)
    while frame is not None:
        number = numbers.get(frame.f_code.co_filename)
        if number is not None:
            return number
        frame = frame.f_back
    return shell.execution_count


def cell_label(filename: str) -> str:
    """``Cell In[7]`` for code typed in a notebook cell, else the file name unchanged.

    >>> cell_label("/tmp/ipykernel_12/3456.py"), cell_label("train.py")
    ('a notebook cell', 'train.py')
    """
    try:
        from IPython import get_ipython

        shell = get_ipython()
        number = shell.compile._filename_map.get(filename) if shell is not None else None
    except Exception:  # noqa: BLE001 - IPython missing or a different compiler
        number = None
    if number is not None:
        return f"Cell In[{number}]"
    if re.search(r"ipykernel_\d+[/\\]\d+\.py$", filename) or filename.startswith("<ipython-input"):
        return "a notebook cell"
    return filename


def relabel_traceback(text: str) -> str:
    """Replace notebook cells' temporary file names in a traceback by ``Cell In[N]``.

    >>> relabel_traceback('File "/tmp/ipykernel_12/3456.py", line 2, in f')
    'a notebook cell, line 2, in f'
    """

    def label(match: re.Match) -> str:
        name = cell_label(match.group(1))
        return match.group(0) if name == match.group(1) else f"{name}, line"

    return re.sub(r'File "([^"]+)", line', label, text)
