"""Peak resident memory of a fresh process that loads a model and translates (``bench
--memory``).

Part of ``fairseq-headprune bench`` (see ``bench``), which checks that the heads Voita et al.
2019 ("Analyzing Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest
Can Be Pruned") prune away make the exported model smaller in memory, not only in parameters.
"""

from __future__ import annotations

import multiprocessing
import resource
from argparse import Namespace


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _peak_rss_child(path: str, data: str, subset: str, n: int, bs: int, beam: int, q) -> None:
    """Peak RSS from loading the model to the end of translating (imports excluded)."""
    from fairseq import tasks  # noqa: F401  (the import peak happens before the reset)

    from fairseq_headprune.bench import load, make_batches, sentences, time_batches

    try:  # reset the high-water mark so that the import peak does not hide the model's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        peak = _vm_hwm
    except OSError:

        def peak() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    model, task = load(path, data)
    items = sentences(task, subset, n)
    gen = task.build_generator([model], Namespace(beam=beam))
    batches = make_batches(task, subset, items, bs)
    time_batches(lambda b: task.inference_step(gen, [model], b), batches)
    q.put(peak())


def peak_rss(path: str, data: str, subset: str, n: int, bs: int, beam: int) -> int:
    """Peak resident bytes of a fresh process that loads ``path`` and translates ``n``
    sentences of ``subset`` at batch ``bs`` and ``beam`` (``bench --memory``)."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_peak_rss_child, args=(path, data, subset, n, bs, beam, q))
    proc.start()
    value = q.get()
    proc.join()
    return value
