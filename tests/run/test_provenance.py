"""What a run records of the code it ran: the package's version and its source commit."""

import shutil
import subprocess

from filledfirst.run import provenance

from conftest import REPO


def test_the_source_commit_is_the_checkouts_head_and_says_when_it_had_changes():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        assert provenance.source_commit() is None
        return
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert provenance.source_commit() == (f"{head}+dirty" if dirty else head)
    assert provenance.versions()["filledfirst_commit"] == provenance.source_commit()


def test_a_copy_outside_a_checkout_records_no_commit(tmp_path, monkeypatch):
    """A package directory git does not track (an installed wheel, a venv inside another
    checkout) has no commit of its own."""
    fake = tmp_path / "site-packages" / "filledfirst"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # a checkout that does not track it
    monkeypatch.setattr(provenance.filledfirst, "__file__", str(fake / "__init__.py"))
    assert provenance.source_commit() is None
