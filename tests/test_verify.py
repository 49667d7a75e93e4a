"""`bertrain inspect DATA_DIR --verify`: each shard's sha256 in the manifest (so the fingerprint covers the shards'
bytes), a changed byte that np.load cannot see named with the way to rebuild, and data prepared without checksums."""

import hashlib
import json

from bertrain.data.format import open_prepared, shard_paths, write_manifest
from bertrain.data.prepare import prepare_corpus
from bertrain.data.sources.pydoc import write_pydoc_corpus
from tests.test_prepare import recipe


def _prepare(tmp_path):
    corpus = tmp_path / "pydoc"
    if not corpus.exists():
        write_pydoc_corpus(corpus)
    return prepare_corpus(recipe(corpus, shards=3, validation=0.1), tmp_path / "data")


def test_each_shard_record_keeps_the_sha256_of_its_files(tmp_path):
    manifest = _prepare(tmp_path)
    for split, entry in manifest["splits"].items():
        for record in entry["shards"]:
            digest = hashlib.sha256()  # the reference: the files' bytes, concatenated in the order they are written
            for path in shard_paths(tmp_path / "data" / split, record["name"]).values():
                digest.update(path.read_bytes())
            assert record["sha256"] == digest.hexdigest()


def test_verify_names_a_changed_shard_and_prepare_rebuilds_it(tmp_path, run_cli):
    manifest = _prepare(tmp_path)
    data = str(tmp_path / "data")
    code, out, err = run_cli("inspect", data, "--verify")
    assert code == 0 and "All 4 shards match their checksums" in " ".join(out.split()), out + err

    tokens = tmp_path / "data" / "train" / "shard-00001.tokens.npy"
    content = bytearray(tokens.read_bytes())
    content[-3] ^= 1  # one bit in the token ids: the file still loads, with one wrong token
    tokens.write_bytes(bytes(content))
    assert len(open_prepared(data).split("train").shards[1].tokens) > 0
    code, out, err = run_cli("inspect", data, "--verify")
    said = " ".join(err.split())
    assert code == 1 and "1 of 4 shards differ from their checksum: train/shard-00001." in said, said
    assert "Delete their files" in said and "shard-00001.*" in said

    for path in shard_paths(tmp_path / "data" / "train", "shard-00001").values():  # what the message says to do
        path.unlink()
    assert _prepare(tmp_path)["fingerprint"] == manifest["fingerprint"]
    assert run_cli("inspect", data, "--verify")[0] == 0


def test_a_manifest_gathered_again_is_the_same_with_a_shard_record_from_before_checksums(tmp_path):
    # Also after the documents' text was removed: the normalization stats were measured on it when the manifest was
    # first gathered, so a second gathering lost them and changed the fingerprint.
    manifest = _prepare(tmp_path)
    record_path = tmp_path / "data" / "work" / "shards" / "train-shard-00000.json"
    record = json.loads(record_path.read_text())
    del record["sha256"]  # tokenized by an older bertrain, then the prepare resumed by this one
    record_path.write_text(json.dumps(record))
    (tmp_path / "data" / "manifest.json").unlink()
    assert _prepare(tmp_path)["fingerprint"] == manifest["fingerprint"]


def test_data_prepared_without_checksums_cannot_be_verified_and_says_so(tmp_path, run_cli):
    manifest = _prepare(tmp_path)
    for entry in manifest["splits"].values():
        for record in entry["shards"]:
            del record["sha256"]
    write_manifest(tmp_path / "data", {k: v for k, v in manifest.items() if k != "fingerprint"})
    code, out, err = run_cli("inspect", str(tmp_path / "data"), "--verify")
    said = " ".join(err.split())
    assert code == 1 and "keeps no checksum for 4 of 4 shards" in said and "new DATA_DIR" in said, said


def test_verify_names_a_missing_shard_file_as_unreadable(tmp_path, run_cli):
    _prepare(tmp_path)
    (tmp_path / "data" / "validation" / "shard-00000.sentences.npy").unlink()
    code, out, err = run_cli("inspect", str(tmp_path / "data"), "--verify")
    said = " ".join(err.split())
    assert code == 1 and "1 of 4 shards differ from their checksum: validation/shard-00000 (unreadable: No such " \
        "file or directory)." in said, said
