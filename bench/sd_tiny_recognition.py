#!/usr/bin/env python3
"""Are sd-tiny's samples recognisably their class? A small CNN trained on the real
Fashion-MNIST training set (torch, CPU) classifies images `hyperion generate` makes for
each caption "a photo of a NAME"; the accuracy per class against the prompt's class is the
measure (10% is chance; the same CNN's accuracy on the real test set is the ceiling).

    /usr/bin/python3 bench/sd_tiny_recognition.py --hyperion build/release/hyperion \\
        --checkpoint runs/sd-tiny/checkpoints/1500 [--per-class 40] [--steps 30] [--json]
"""

import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"]
DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(n, rows, cols)
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


def read_png_gray(path):
    """8-bit gray or RGB, non-interlaced PNG (what hyperion writes) -> [H, W] floats in [0, 1]."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (0, 2), (depth, ctype, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 1 if ctype == 0 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    out, prev = [], bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    t = torch.tensor(list(b"".join(out)), dtype=torch.float32).reshape(height, width, bpp)
    return t.mean(-1) / 255.0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64 * 8 * 8, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.out(F.relu(self.fc(x.flatten(1))))


def to32(images_u8):
    x = images_u8.float()[:, None] / 255.0
    return F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hyperion", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    xtr, ytr = to32(read_idx(f"{DATA}/train-images-idx3-ubyte.gz")), read_idx(f"{DATA}/train-labels-idx1-ubyte.gz")
    xte, yte = to32(read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz")), read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz")
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(a.epochs):
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 128):
            idx = perm[i:i + 128]
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        real_acc = (net(xte).argmax(-1) == yte).float().mean().item()
    per_class = {}
    with tempfile.TemporaryDirectory() as work, torch.no_grad():
        for c, name in enumerate(CLASSES):
            images, done, seed = [], 0, 100 * c
            while done < a.per_class:
                n = min(16, a.per_class - done)
                out = os.path.join(work, f"{c}.png")
                subprocess.run([a.hyperion, "--threads", str(a.threads), "generate", "--checkpoint", a.checkpoint,
                                "--prompt", f"a photo of a {name}", "--steps", str(a.steps), "--guidance",
                                str(a.guidance), "--scheduler", "ddim", "--seed", str(seed), "--batch", str(n),
                                "--output", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for i in range(n):
                    images.append(read_png_gray(out if i == 0 else out[:-4] + f"-{i}.png"))
                done += n
                seed += 1
            x = torch.stack(images)[:, None]
            per_class[name] = (net(x).argmax(-1) == c).float().mean().item()
    mean = sum(per_class.values()) / len(per_class)
    result = {"classifier_real_test_accuracy": real_acc, "generated_accuracy": mean, "per_class": per_class,
              "per_class_images": a.per_class, "steps": a.steps, "guidance": a.guidance}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"classifier accuracy on the real test set: {real_acc:.3f}")
        for name, acc in per_class.items():
            print(f"  {name:12s} {acc:.3f}")
        print(f"generated images classified as their prompt's class: {mean:.3f} (chance 0.100)")


if __name__ == "__main__":
    sys.exit(main())
