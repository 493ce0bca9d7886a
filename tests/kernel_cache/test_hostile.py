"""Kernel-cache attacks from the two sides that can reach it: the engine container, which writes in the cache folder
as root (links planted before a restore, files swapped during a save), and a bucket writer (archives that unpack to
far more than they say). Each test runs the attack and shows it stopped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import threading
import time

import pytest

from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.node import kernel_cache as program
from kimi_cluster.plan import kernel_cache
from tests.kernel_cache.conftest import BUCKET
from tests.kernel_cache.test_restore_save import cache_dir, compiled, files_under, run_step, settings_for

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools


def put_archive(store, settings, prefix, members, **manifest_extra):
    """An archive of (name, bytes) members and its manifest in the bucket, as a bucket writer could put them."""
    key = kernel_cache.cache_key(engine_inputs(settings))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    manifest = {"key": key.id, "fields": key.fields, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body),
                **manifest_extra}
    s3 = store.client()
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{key.id}/cache.tar.gz", Body=body)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{key.id}/manifest.json", Body=json.dumps(manifest).encode())
    return body


@pytest.mark.parametrize("planted", ["triton", "triton/5f3a"])
def test_a_link_planted_in_the_cache_folder_is_never_followed_by_a_restore(node_factory, store, planted):
    """The container plants `triton -> /etc/cron.d` (here a folder outside the cache); the restore writes nothing
    there and starts cold naming the link."""
    node = node_factory()
    prefix = "planted-" + planted.replace("/", "-")
    s = settings_for(node, store, prefix)
    put_archive(store, s, prefix, [("triton/5f3a/evil.cubin", b"* * * * * root touch /pwned\n")])
    outside = node.root / "etc/cron.d"
    outside.mkdir(parents=True)
    link = cache_dir(node) / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)

    out = run_step(node, s, "cache-restore", store.credentials)
    assert list(outside.iterdir()) == [], "the restore wrote through the planted link"
    assert "starting cold: refusing" in out and "not a plain folder" in out, out


def test_a_file_swapped_for_a_link_between_select_and_pack_is_not_packed(tmp_path):
    """select checks a file; the container swaps it for a link to a root-only token before pack opens it."""
    cache = tmp_path / "cache"
    (cache / "triton/ab").mkdir(parents=True)
    victim = cache / "triton/ab/kernel.cubin"
    victim.write_bytes(b"\x7fELF kernel")
    (cache / "triton/ab/other.cubin").write_bytes(b"\x7fELF other")
    token = tmp_path / "root-only-token"
    token.write_text("hf_rootOnlyTokenThatMustNotTravel")
    sel = program.select(str(cache), [])
    assert [rel for rel, _ in sel.files] == ["triton/ab/kernel.cubin", "triton/ab/other.cubin"]

    victim.unlink()
    victim.symlink_to(token)  # the swap, after the check
    archive = tmp_path / "cache.tar.gz"
    packed = program.pack(str(cache), sel, str(archive), [])
    assert [rel for rel, _ in packed.files] == ["triton/ab/other.cubin"]
    assert any("triton/ab/kernel.cubin (changed during the save" in line for line in packed.stripped)
    with tarfile.open(archive) as tar:
        assert tar.getnames() == ["triton/ab/other.cubin"]
        data = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    assert b"hf_rootOnly" not in data


def test_a_file_replaced_by_another_between_select_and_pack_is_not_packed(tmp_path):
    cache = tmp_path / "cache"
    (cache / "triton").mkdir(parents=True)
    victim = cache / "triton/k.cubin"
    victim.write_bytes(b"\x7fELF kernel")
    sel = program.select(str(cache), [])
    replacement = cache / "triton/new"
    replacement.write_bytes(b"\x7fELF other file")
    os.replace(replacement, victim)  # a new inode under the checked name
    packed = program.pack(str(cache), sel, str(tmp_path / "a.tar.gz"), [])
    assert packed.files == [] and "replaced by another file" in packed.stripped[-1]


def test_a_secret_written_into_a_checked_file_before_pack_stops_the_save(tmp_path):
    """The scan reads the bytes that go into the archive: rewriting a checked file in place is caught."""
    secret = b"hf_rootOnlyTokenThatMustNotTravel"
    cache = tmp_path / "cache"
    (cache / "triton").mkdir(parents=True)
    victim = cache / "triton/k.cubin"
    victim.write_bytes(b"\0" * (len(secret) + 10))
    sel = program.select(str(cache), [secret])
    assert sel.files
    with open(victim, "r+b") as fh:  # same inode, same size: only the content changes
        fh.write(secret)
    with pytest.raises(program.CacheError, match="came to hold a secret"):
        program.pack(str(cache), sel, str(tmp_path / "a.tar.gz"), [secret])


def test_a_planted_fifo_or_device_node_is_refused_before_it_is_opened(tmp_path):
    """The save opened every candidate (O_NONBLOCK, but opened) before checking its type: a device node's driver
    runs its open, and a FIFO's writer wakes. Here a writer waits in open() on a FIFO planted among the kernels; the
    save must leave it waiting, and leave out the FIFO and a device node (as root, like the engine) by name."""
    cache = tmp_path / "cache"
    (cache / "triton/ab").mkdir(parents=True)
    (cache / "triton/ab/kernel.cubin").write_bytes(b"\x7fELF kernel")
    fifo = cache / "triton/ab/planted.cubin"
    os.mkfifo(fifo)
    woke = threading.Event()

    def writer() -> None:
        with open(fifo, "wb"):  # returns once someone opens the FIFO for reading
            woke.set()

    threading.Thread(target=writer, daemon=True).start()
    time.sleep(0.3)  # the writer is in its open() by now
    device = cache / "triton/ab/null.cubin"
    if os.geteuid() == 0:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    try:
        sel = program.select(str(cache), [])
        woke_during_select = woke.wait(1.0)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # release the writer thread, if it still waits
    assert not woke_during_select, "the save opened the planted FIFO"
    assert [rel for rel, _ in sel.files] == ["triton/ab/kernel.cubin"]
    assert "triton/ab/planted.cubin (not a regular file)" in sel.stripped
    if os.geteuid() == 0:
        assert "triton/ab/null.cubin (not a regular file)" in sel.stripped


def test_select_does_not_follow_a_linked_folder(tmp_path):
    cache = tmp_path / "cache"
    (cache / "triton").mkdir(parents=True)
    secrets = tmp_path / "etc"
    secrets.mkdir()
    (secrets / "kernel.cubin").write_text("hf_rootOnlyTokenThatMustNotTravel")
    (cache / "triton/ab").symlink_to(secrets)
    assert program.select(str(cache), []).files == []


def test_an_archive_that_unpacks_past_what_its_manifest_records_is_refused(node_factory, store):
    """A 20 MB file of zeros packs to about 20 KB; the manifest says the files are 1 KB: nothing is unpacked."""
    node = node_factory()
    s = settings_for(node, store, "bomb")
    body = put_archive(store, s, "bomb", [("triton/zero.cubin", b"\0" * 20_000_000)], bytes=1000, files=1)
    assert len(body) < 100_000
    out = run_step(node, s, "cache-restore", store.credentials)
    assert "starting cold: the archive unpacks to more than 0.0 MB; refusing it" in out, out
    assert files_under(cache_dir(node)) == []


def test_an_archive_with_more_entries_than_its_manifest_records_is_refused(node_factory, store):
    node = node_factory()
    s = settings_for(node, store, "many")
    put_archive(store, s, "many", [(f"triton/{i}.cubin", b"x") for i in range(200)], bytes=200, files=2)
    out = run_step(node, s, "cache-restore", store.credentials)
    assert "starting cold: the archive holds more than" in out and "entries; refusing it" in out, out
    assert files_under(cache_dir(node)) == []


def test_an_archive_larger_than_its_manifest_says_is_not_downloaded(node_factory, store):
    node = node_factory()
    s = settings_for(node, store, "bigger")
    body = put_archive(store, s, "bigger", [("triton/a.cubin", os.urandom(50_000))])
    key = kernel_cache.cache_key(engine_inputs(s))
    manifest = {"key": key.id, "fields": key.fields, "sha256": hashlib.sha256(body).hexdigest(), "size": 100}
    store.client().put_object(Bucket=BUCKET, Key=f"bigger/{key.id}/manifest.json", Body=json.dumps(manifest).encode())
    out = run_step(node, s, "cache-restore", store.credentials)
    assert f"starting cold: the archive is {len(body):,} bytes, the manifest recorded 100" in out, out
    assert "downloaded:" not in out


def test_the_fixed_caps_hold_whatever_the_manifest_says():
    with pytest.raises(program.CacheError, match="more than the"):
        program.unpack_limits({"size": program.MAX_ARCHIVE_BYTES + 1})
    with pytest.raises(program.CacheError, match="not a byte or file count"):
        program.unpack_limits({"size": 10, "bytes": "lots"})
    assert program.unpack_limits({"size": 10, "bytes": 10**15, "files": 10**9}) == (
        10, program.MAX_UNPACKED_BYTES, program.MAX_MEMBERS)
    assert program.unpack_limits({"size": 10}) == (10, program.MAX_UNPACKED_BYTES, program.MAX_MEMBERS)


def test_a_saved_archive_still_restores_within_its_own_limits(node_factory, store):
    """The caps are tied to what a real save records: a genuine archive passes them."""
    saver, fresh = node_factory(), node_factory()
    s = settings_for(saver, store, "genuine")
    files = compiled(saver)
    run_step(saver, s, "cache-save", store.credentials)
    out = run_step(fresh, settings_for(fresh, store, "genuine"), "cache-restore", store.credentials)
    assert f"restored {len(files)} kernel files" in out, out
