"""benchmarks/e2e_decode.py, plus the host time of each decode step's planning calls.

    python benchmarks/e2e_host_times.py [e2e_decode.py's arguments]

The synthetic workers (run through this file instead of e2e_decode.py) time
FlashInfer's and LOCKS's per-step metadata calls, ModelRunner.forward and the
summary store's decode-seal bookkeeping with time.perf_counter, and print one
``hosttime NAME: n=... median ... ms mean ... ms`` line per call at exit (into
the per-process logs of --log-dir). The synthetic tool times whole steps with
the host waiting for the GPU, so host time spent before a graph replay adds to
the step; a server with the overlap scheduler hides part of it.
"""

import atexit
import collections
import os
import statistics
import sys
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import e2e_decode  # noqa: E402

TIMES = collections.defaultdict(list)


def timed(cls, name: str, tag: str) -> None:
    fn = getattr(cls, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        TIMES[tag].append(time.perf_counter() - t0)
        return out

    setattr(cls, name, wrapper)


def report() -> None:
    for tag, times in sorted(TIMES.items()):
        times = times[5:] or times  # the first calls include capture and warm-up
        print(f"hosttime {tag}: n={len(times)} median {1e3 * statistics.median(times):.3f} ms "
              f"mean {1e3 * statistics.mean(times):.3f} ms", flush=True)


def install() -> None:
    from sglang.benchmark import one_batch  # noqa: F401  (SGLang's own import order first)
    from sglang.srt.layers.attention import flashinfer_backend
    from sglang.srt.model_executor import model_runner

    from sglang_locks import sparse_decode
    from sglang_locks.plugin import attention_backend, summary_store

    timed(flashinfer_backend.FlashInferAttnBackend, "init_forward_metadata_out_graph",
          "flashinfer.init_forward_metadata_out_graph")
    timed(model_runner.ModelRunner, "forward", "ModelRunner.forward")
    timed(attention_backend.LocksFlashInferAttnBackend, "init_forward_metadata_out_graph",
          "locks.init_forward_metadata_out_graph")
    timed(sparse_decode.SparseDecodeWrapper, "plan", "SparseDecodeWrapper.plan")
    timed(summary_store.SummaryStore, "flush_pending", "store.flush_pending")
    timed(summary_store.SummaryStore, "record_decode_seals", "store.record_decode_seals")
    atexit.register(report)


def main() -> int:
    if "--synthetic-worker" in sys.argv:
        install()
    else:  # run the workers through this file
        command = e2e_decode.command

        def through_here(*args, **kwargs):
            cmd = command(*args, **kwargs)
            if "--synthetic-worker" in cmd:
                cmd[1] = HERE
            return cmd

        e2e_decode.command = through_here
    return e2e_decode.main()


if __name__ == "__main__":
    sys.exit(main())
