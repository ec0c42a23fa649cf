"""Runs every ```sh example of docs/user-guide.md, in order, in a directory
with the files the guide names, and checks what the examples produce."""
import os
import re
import shutil
import subprocess
import sys

from bsmount import (BIN, FIX, SOURCE_DIR, check, finish, force_unmount, read_bpk, tmpdir)

GUIDE = os.path.join(SOURCE_DIR, "docs/user-guide.md")


def main():
    text = open(GUIDE).read()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    check(len(blocks) >= 9, "the guide has its examples (%d found)" % len(blocks))
    with tmpdir("guide") as d:
        shutil.copy(os.path.join(FIX, "burn-store/pytorch-tests/tests/complex_nested/complex_nested.pt"),
                    os.path.join(d, "model.pth"))
        shutil.copy(os.path.join(FIX, "burn-store/src/pytorch/tests/reader/test_data/checkpoint.pt"),
                    os.path.join(d, "checkpoint.pth"))
        shutil.copy(os.path.join(FIX, "burn-store/safetensors-tests/tests/multi_layer/multi_layer.safetensors"),
                    os.path.join(d, "model.safetensors"))
        sys.path.insert(0, os.path.join(SOURCE_DIR, "tests/support"))
        import gguf_fixture
        gguf_fixture.write_tiny(os.path.join(d, "model.gguf"))
        bindir = os.path.dirname(os.path.abspath(BIN))
        env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"])
        try:
            for i, block in enumerate(blocks):
                r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=d, env=env,
                                   capture_output=True, text=True, timeout=300)
                first = block.strip().splitlines()[0]
                check(r.returncode == 0, "example %d (%s) failed (%d):\n%s%s" % (
                    i + 1, first, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))
                if r.returncode != 0:
                    break
        finally:
            for m in ("m", "old", "new"):
                force_unmount(os.path.join(d, m))
        for f in ("surgery.bpk", "scratch.bpk", "edited.bpk", "model.bpk", "fc-only.bpk"):
            check(os.path.exists(os.path.join(d, f)), "the guide's examples wrote %s" % f)
        if os.path.exists(os.path.join(d, "edited.bpk")):
            keys = set(read_bpk(os.path.join(d, "edited.bpk"))[0])
            check(any(k.startswith("backbone.") for k in keys) and not any(k.startswith("head.") for k in keys),
                  "edited.bpk has the rename and the removal: %s" % sorted(keys)[:5])
        if os.path.exists(os.path.join(d, "fc-only.bpk")):
            keys = set(read_bpk(os.path.join(d, "fc-only.bpk"))[0])
            check(keys == {"fc1.weight", "fc1.bias"}, "fc-only.bpk holds fc1 only: %s" % sorted(keys))
        if os.path.exists(os.path.join(d, "scratch.bpk")):
            t, meta = read_bpk(os.path.join(d, "scratch.bpk"))
            check(t.get("w", (0, 0))[:2] == ("F32", [2, 3]) and meta.get("author") == "me", "scratch.bpk: %r" % ((t, meta),))
        g = gguf_fixture.Reader(os.path.join(d, "model.gguf"))
        check(g.kv["general.name"] == (gguf_fixture.VSTRING, "My fine-tune") and
              g.kv["tokenizer.chat_template"][1].startswith("{% for m in messages %}<|"),
              "the GGUF example changed general.name and the chat template: %r" % (g.kv["general.name"],))
        check(os.path.getsize(os.path.join(d, "token_embd.bin")) == 24, "cp extracted token_embd.weight")
        conv = os.path.join(d, "converted.safetensors")
        check(os.path.exists(conv), "the guide's examples wrote converted.safetensors")
        sh = os.path.join(d, "sharded")
        names = sorted(os.listdir(sh)) if os.path.isdir(sh) else []
        check(len(names) >= 3 and "model.safetensors.index.json" in names and
              all(n.startswith("model-") for n in names if n != "model.safetensors.index.json"),
              "the guide's examples wrote a shard set: %r" % names)
    finish("test_user_guide")


if __name__ == "__main__":
    main()
