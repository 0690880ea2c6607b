"""Plot benchmarks/results/e2e_decode.json -> e2e_decode.png (decode ms/token, FullKV vs LOCKS)."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path="benchmarks/results/e2e_decode.json", out="benchmarks/results/e2e_decode.png"):
    d = json.load(open(path))
    rows = [r for r in d["rows"] if r.get("fullkv_ms") and r.get("locks_ms")]
    labels = [f"{r['shape']}\nbs{r['batch']} {r['context'] // 1024}K\n{r['tool']}"
              + (f"\ncall {r['device_call']}" if "device_call" in r else "")
              + (f"\nprocess {r['process']}" if "process" in r else "") for r in rows]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(7, len(rows) * 1.2), 4.5))
    w = 0.38
    ax.bar([i - w / 2 for i in x], [r["fullkv_ms"] for r in rows], w, label="FullKV (FlashInfer, page 16)", color="#777")
    extra = sorted({r.get("locks_args", "") for r in rows})  # the LOCKS flags beyond --enable-locks, if any
    label = "--enable-locks" + (f" {extra[0]}" if len(extra) == 1 and extra[0] else "")
    ax.bar([i + w / 2 for i in x], [r["locks_ms"] for r in rows], w, label=label, color="#27ae60")
    for i, r in zip(x, rows):
        ax.text(i + w / 2, r["locks_ms"], f"{r['speedup']:.3f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylabel("decode ms per token (median step; bench_serving: inter-token latency)", fontsize=8)
    ax.set_title(f"{d['gpu']}, budget {rows[0]['budget'] if rows else '-'}, {d['date'][:10]} "
                 f"(git {d.get('git', 'see JSON')})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
