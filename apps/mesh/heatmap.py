#!/usr/bin/env python3
"""Heat map of an rdmakit-mesh CSV (writer, target, mb_per_s, ...) as a PNG."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
n = 1 + max(max(int(r["writer"]), int(r["target"])) for r in rows)
grid = [[0.0] * n for _ in range(n)]
for r in rows:
    grid[int(r["writer"])][int(r["target"])] = float(r["mb_per_s"])
fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 0.8 + 0.6 * n))
im = ax.imshow(grid, cmap="viridis")
ax.set_xlabel("target rank")
ax.set_ylabel("writer rank")
ax.set_title("rdmakit-mesh WRITE bandwidth (MB/s)")
for i in range(n):
    for j in range(n):
        if i != j:
            ax.text(j, i, f"{grid[i][j]:.0f}", ha="center", va="center", color="w", fontsize=7)
fig.colorbar(im, ax=ax)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
