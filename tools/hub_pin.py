"""Print a catalogue entry's repository, commit and files as the Hugging Face Hub reports them
(each file's size, an LFS file's sha256, a small file's git blob sha1), for review before it goes
into resources/catalogue.json. Run where the hub is reachable (HF_ENDPOINT names a mirror).

    python -m tools.hub_pin rhasspy/piper-voices main \\
        en/en_US/lessac/medium/en_US-lessac-medium.onnx en/en_US/lessac/medium/en_US-lessac-medium.onnx.json
"""

from __future__ import annotations

import argparse
import json
import os


def pin(repo: str, revision: str, paths: list[str]) -> dict:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    commit = api.model_info(repo, revision=revision).sha
    found = {f.path: f for f in api.get_paths_info(repo, paths, revision=commit)}
    missing = [p for p in paths if p not in found]
    if missing:
        raise SystemExit(f"not in {repo}@{commit}: {', '.join(missing)}")
    files = []
    for p in paths:
        f = found[p]
        digest = {"sha256": f.lfs.sha256} if f.lfs else {"git_sha1": f.blob_id}
        files.append({"path": p, "size": f.size, **digest})
    return {"repo": repo, "revision": commit, "files": files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repo")
    ap.add_argument("revision", help="a branch, tag or commit: the entry pins the commit it names now")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    print(json.dumps(pin(args.repo, args.revision, args.paths), indent=2))


if __name__ == "__main__":
    main()
