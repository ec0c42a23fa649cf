"""The PyTorch-to-Burn adapter view (issue 13): `-o adapter=pytorch` on
torch-made modules. Linear weights (2-D `weight` with a sibling `bias` of
its first dimension) read as weight.t().contiguous() with the shape [in, out],
through strides (also when the file's weight is itself a strided view);
norm `weight`/`bias` (1-D) appear as `gamma`/`beta`, as burn-store's
PyTorchToBurnAdapter feeds them to Burn's norm modules; conv, embedding and
the rest unchanged; adapter_linear=/adapter_norm= name keys explicitly; the
same through the CLI (`cat`, `convert`) and with .npy views; rename
collisions and writable mounts are refused in one line."""
import os

import numpy as np
import torch
from torch import nn

from bsmount import BIN, Mount, check, finish, force_unmount, is_mounted, read_bpk, run, tmpdir


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.conv = nn.Conv1d(6, 4, 3)
        self.bn = nn.BatchNorm1d(4)
        self.fc1 = nn.Linear(6, 5)
        self.ln = nn.LayerNorm(5)
        self.gn = nn.GroupNorm(1, 4)
        self.head = nn.Linear(5, 3, bias=False)
        self.fc_f64 = nn.Linear(3, 2).double()


def raw(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def shape_of(p):
    return os.getxattr(p, "user.burnstore.shape").decode()


def test_mount(tmp, sd, pth):
    with Mount(pth, os.path.join(tmp, "m1"), "adapter=pytorch,npy") as mnt:
        for lin in ("fc1", "fc_f64"):
            w = sd[lin + ".weight"]
            p = os.path.join(mnt, lin, "weight")
            check(open(p, "rb").read() == raw(w.t()), "%s.weight reads as weight.t().contiguous()" % lin)
            check(shape_of(p) == "[%d,%d]" % (w.shape[1], w.shape[0]), "%s.weight shape [in,out]: %s" % (lin, shape_of(p)))
            check(os.stat(p).st_size == len(raw(w)), "%s.weight size unchanged" % lin)
            a = np.load(p + ".npy")
            check(np.array_equal(a, w.t().numpy()), "%s.weight.npy is the transposed weight" % lin)
            check(open(os.path.join(mnt, lin, "bias"), "rb").read() == raw(sd[lin + ".bias"]), "%s.bias unchanged" % lin)
        p = os.path.join(mnt, "head", "weight")
        check(open(p, "rb").read() == raw(sd["head.weight"]), "a Linear without bias is not detected by the rule (unchanged)")
        for norm in ("bn", "ln", "gn"):
            d = os.path.join(mnt, norm)
            names = set(os.listdir(d))
            check("gamma" in names and "beta" in names and "weight" not in names and "bias" not in names,
                  "%s: weight/bias are gamma/beta: %r" % (norm, sorted(names)))
            if "gamma" in names:
                check(open(os.path.join(d, "gamma"), "rb").read() == raw(sd[norm + ".weight"]), "%s.gamma = weight" % norm)
                check(open(os.path.join(d, "beta"), "rb").read() == raw(sd[norm + ".bias"]), "%s.beta = bias" % norm)
                check(os.getxattr(os.path.join(d, "gamma"), "user.burnstore.key") == (norm + ".weight").encode(),
                      "%s.gamma's key xattr names the file's key" % norm)
        check(open(os.path.join(mnt, "bn", "running_var"), "rb").read() == raw(sd["bn.running_var"]), "bn.running_var unchanged")
        for k in ("emb.weight", "conv.weight", "conv.bias"):
            p = os.path.join(mnt, *k.split("."))
            check(open(p, "rb").read() == raw(sd[k]), "%s unchanged" % k)
    # explicit lists replace the rule
    with Mount(pth, os.path.join(tmp, "m2"), r"adapter=pytorch,adapter_linear=^head\.,adapter_norm=^ln\.") as mnt:
        check(open(os.path.join(mnt, "head", "weight"), "rb").read() == raw(sd["head.weight"].t()),
              "adapter_linear= transposes head.weight")
        check(open(os.path.join(mnt, "fc1", "weight"), "rb").read() == raw(sd["fc1.weight"]),
              "adapter_linear= given: fc1 (not listed) unchanged")
        check(sorted(os.listdir(os.path.join(mnt, "ln"))) == ["beta", "gamma"] and
              "weight" in os.listdir(os.path.join(mnt, "bn")), "adapter_norm= renames only ln")


def test_strided_source(tmp):
    """The file's weight is itself a transposed view: the adapter swaps its strides."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(7, 4, generator=g)
    sd = {"l.weight": base.t(), "l.bias": torch.randn(4, generator=g)}  # weight [4,7], strided
    pth = os.path.join(tmp, "s.pth")
    torch.save(sd, pth)
    with Mount(pth, os.path.join(tmp, "m3"), "adapter=pytorch") as mnt:
        p = os.path.join(mnt, "l", "weight")
        check(open(p, "rb").read() == raw(sd["l.weight"].t()) == raw(base), "a strided weight adapted = weight.t()")
        check(shape_of(p) == "[7,4]", "its shape: %s" % shape_of(p))


def test_cli(tmp, sd, pth):
    r = run([BIN, "ls", "-o", "adapter=pytorch", pth])
    rows = {l.split("\t")[0]: l.split("\t")[1:] for l in r.stdout.splitlines()}
    check(rows.get("fc1.weight", [None, None])[1] == "[6,5]" and "ln.gamma" in rows and "ln.weight" not in rows,
          "ls -o adapter=pytorch: %r" % sorted(rows)[:8])
    import subprocess
    r = subprocess.run([BIN, "cat", "-o", "adapter=pytorch", pth, "fc1.weight"], capture_output=True, timeout=60)
    check(r.returncode == 0 and r.stdout == raw(sd["fc1.weight"].t()), "cat -o adapter=pytorch: the transposed bytes")
    out = os.path.join(tmp, "burn.bpk")
    r = run([BIN, "convert", "-o", "adapter=pytorch", pth, out])
    check(r.returncode == 0, "convert -o adapter=pytorch: %r" % r.stderr)
    if r.returncode == 0:
        got, _ = read_bpk(out)
        check(got["fc1.weight"][1] == [6, 5] and got["fc1.weight"][2] == raw(sd["fc1.weight"].t()),
              "the converted Burnpack holds fc1.weight transposed")
        check(got["ln.gamma"][2] == raw(sd["ln.weight"]) and "ln.weight" not in got, "and ln.gamma")


def test_refusals(tmp, sd, pth):
    coll = os.path.join(tmp, "coll.pth")
    torch.save({"n.weight": torch.ones(3), "n.gamma": torch.zeros(3)}, coll)
    mnt = os.path.join(tmp, "m4")
    os.makedirs(mnt, exist_ok=True)
    for src, opts, what in ((coll, "adapter=pytorch", "already has"),
                            (pth, "adapter=pytorch,rw,output=%s" % os.path.join(tmp, "x.bpk"), "read-only"),
                            (pth, "adapter=tensorflow", "the one adapter is 'pytorch'"),
                            (pth, "adapter_linear=fc", "need adapter=pytorch")):
        try:
            r = run([BIN, src, mnt, "-o", opts])
            check(r.returncode != 0 and not is_mounted(mnt) and len(r.stderr.strip().splitlines()) == 1
                  and what in r.stderr, "-o %s refused in one line saying %r: %r" % (opts, what, r.stderr))
        finally:
            force_unmount(mnt)
    r = run([BIN, "ls", "-o", "adapter=pytorch", coll])
    check(r.returncode == 1 and "n.gamma" in r.stderr, "ls names the collision: %r" % r.stderr)


def main():
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p))
        net.bn.running_var.copy_(torch.rand(4) + 0.5)
    sd = net.state_dict()
    with tmpdir("adapter") as tmp:
        pth = os.path.join(tmp, "net.pth")
        torch.save(sd, pth)
        for t in (lambda: test_mount(tmp, sd, pth), lambda: test_strided_source(tmp),
                  lambda: test_cli(tmp, sd, pth), lambda: test_refusals(tmp, sd, pth)):
            try:
                t()
            except Exception as e:
                import traceback
                traceback.print_exc()
                check(False, "raised %r" % e)
        for d in os.listdir(tmp):
            force_unmount(os.path.join(tmp, d))
    finish("test_adapter")


if __name__ == "__main__":
    main()
