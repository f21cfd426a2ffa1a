"""Trust on the bytes that run (issue 23 item 1): the trust check and the load read the same bytes.

A trusted TorchScript file is replaced, over and over while it is loaded, by a hostile one whose ``__setstate__``
(TorchScript runs it at load time) creates a marker file through ``torch.from_file(..., shared=True)``. The
replacement is made by another process, with ``os.replace`` as the review's reproduction did (161 of 6,213 loads ran
the hostile file before the fix). Each load either runs the trusted program or is refused; the hostile one never
runs. Folders (SavedModels) and files a framework opens only by path (Keras) load from a private copy whose sha256 is
computed from the bytes copied.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import mlms_nb
from mlms_nb.errors import UntrustedError
from mlms_nb.manifest import load_manifest
from mlms_nb.trust import asset_digest, trusted_copy

torch = pytest.importorskip("torch")

LOADS = 1000

SWAPPER = """
import os, shutil, sys, time
target, good, evil = sys.argv[1:4]
i = 0
while True:
    tmp = f"{target}.swap{i % 2}"
    shutil.copyfile(evil if i % 2 else good, tmp)
    os.replace(tmp, target)
    i += 1
    time.sleep(0.0002)
"""


class Benign(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Hostile(torch.nn.Module):
    """Its ``__setstate__`` runs when TorchScript loads it and creates the file ``marker``."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker
        self.opened = 0

    def forward(self, x):
        return x + 2

    @torch.jit.export
    def __getstate__(self) -> tuple[str, bool]:
        return (self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[str, bool]) -> None:
        self.marker = state[0]
        self.training = state[1]
        self.opened = torch.from_file(self.marker, shared=True, size=1).numel()  # creates the marker file (used, so
        # TorchScript keeps the call)


def test_a_file_swapped_during_loads_never_runs_untrusted(tmp_path, mlms_home):
    from mlms_nb.frameworks.torch.loading import load_program

    marker = tmp_path / "hostile_ran"
    good, evil, target = tmp_path / "good.pt", tmp_path / "evil.pt", tmp_path / "model.pt"
    torch.jit.script(Benign()).save(str(good))
    torch.jit.script(Hostile(str(marker))).save(str(evil))
    torch.jit.load(str(evil))  # the hostile payload works: loading it creates the marker
    assert marker.exists()
    marker.unlink()

    target.write_bytes(good.read_bytes())
    mlms_nb.trust_add(target)
    manifest_path = tmp_path / "m.yaml"
    manifest_path.write_text("name: race\nframework: {name: torch}\ninputs: [{type: tensor, dimensions: [2]}]\n"
                             "outputs: [{type: tensor}]\nmodel: {graph_path: model.pt}\n")
    manifest = load_manifest(manifest_path)

    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(target), str(good), str(evil)])
    loaded = refused = 0
    try:
        time.sleep(0.1)
        for _ in range(LOADS):
            try:
                module, kind = load_program(target, manifest, False, "cpu")
            except UntrustedError:
                refused += 1
                continue
            assert kind == "torchscript" and float(module(torch.zeros(1))) == 1.0  # the trusted program
            loaded += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert not marker.exists(), "the hostile replacement ran without trust"
    assert loaded + refused == LOADS
    assert loaded > 0 and refused > 0, (loaded, refused)  # the file really was both, many times, during the loads


def test_a_trusted_folder_loads_from_a_private_copy_of_what_was_hashed(tmp_path, mlms_home):
    folder = tmp_path / "saved"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph")
    (folder / "variables" / "v.data").write_bytes(b"weights")
    outside = tmp_path / "outside.txt"
    outside.write_text("not part of the trusted folder")
    os.symlink(outside, folder / "link.txt")  # links are neither hashed nor copied
    mlms_nb.trust_add(folder)

    copy = trusted_copy(folder, "savedmodel", trust=False)
    assert copy != folder.resolve() and asset_digest(copy) == asset_digest(folder)
    assert (copy / "variables" / "v.data").read_bytes() == b"weights" and not (copy / "link.txt").exists()
    assert oct(copy.parent.stat().st_mode & 0o777) == "0o700"  # only this user may write next to the copy
    (folder / "saved_model.pb").write_bytes(b"changed graph")  # a change after the copy never reaches it
    assert (copy / "saved_model.pb").read_bytes() == b"graph"
    with pytest.raises(UntrustedError):  # and the changed folder is no longer trusted
        trusted_copy(folder, "savedmodel", trust=False)
    assert trusted_copy(folder, "savedmodel", trust=True) == folder.resolve()  # per-run trust: load it in place


def test_an_untrusted_folder_is_refused_without_copying(tmp_path, mlms_home):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"graph")
    with pytest.raises(UntrustedError, match="SavedModel"):
        trusted_copy(folder, "savedmodel", trust=False)
