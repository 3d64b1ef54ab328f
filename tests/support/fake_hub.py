"""A small Hugging Face Hub on 127.0.0.1 for the push tests (the real Hub is not reachable from the tests).

It speaks the endpoints huggingface_hub 2.x uses to create a repository and a branch, validate a card and commit
files (hf_api.py create_repo / create_branch / _validate_yaml / create_commit; _commit_api.py
_fetch_upload_modes and _send_commit; lfs.py post_lfs_batch_info and lfs_upload), and the ``resolve`` and
``model_info`` endpoints downloads use, so that a pushed repository can be loaded back with ``from_pretrained``:

    POST /api/repos/create                                   409 when the repository exists
    POST /api/models/{repo}/branch/{branch}                  409 when the branch exists
    POST /api/validate-yaml                                  sharing.card_metadata.validate_card(geonorm=False)
    POST /api/models/{repo}/preupload/{revision}             "lfs" for weight files and files >= 10 MB
    POST /{repo}.git/info/lfs/objects/batch                  basic transfer: upload + verify actions
    PUT  /lfs-upload/{oid}   POST /lfs-verify                checks the sha256 and the size
    POST /api/models/{repo}/commit/{revision}                NDJSON: header, file (base64), lfsFile, deletedFile
    GET|HEAD /{repo}/resolve/{revision}/{path}               X-Repo-Commit, ETag, X-Linked-Etag/-Size
    GET  /api/models/{repo}[/revision/{revision}]            id, sha, siblings

Every /api call but validate-yaml and the LFS batch call need ``Authorization: Bearer <token>``; a wrong
token gets the Hub's 401. Everything the server receives is recorded (``requests``, ``commits``); a request it
does not know is answered 400 and recorded in ``unhandled`` (huggingface_hub's best-effort
``GET /api/agent-harnesses`` is answered 404 and not recorded).

Set ``HF_HUB_DISABLE_XET=1`` for the client: with ``hf_xet`` installed huggingface_hub would upload LFS files
through the Xet protocol, which this server does not speak.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".onnx", ".msgpack", ".model")
LFS_MIN_SIZE = 10 * 1024 * 1024


@contextmanager
def served(monkeypatch: Any, no_login: Path) -> Iterator[FakeHub]:
    """A running local Hub with huggingface_hub pointed at it (``monkeypatch``: pytest's): a valid token in
    HF_TOKEN, online, no Xet, and no stored login (``no_login`` is a token file path that does not exist). Every
    request it received must have been one it knows."""
    from huggingface_hub import constants

    with FakeHub() as server:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(no_login))
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
        monkeypatch.setenv("HF_TOKEN", server.token)
        yield server
        assert not server.unhandled, server.unhandled


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Branch:
    files: dict[str, bytes] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)
    head: str = "0" * 40


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, Branch] = field(default_factory=dict)
    snapshots: dict[str, Branch] = field(default_factory=dict)  # every commit, by oid (clients resolve by oid)

    def revision(self, name: str) -> Branch | None:
        return self.branches.get(name) or self.snapshots.get(name)


class FakeHub:
    """State and a threaded HTTP server; ``url`` is the endpoint to point HF_ENDPOINT at."""

    def __init__(self, token: str = "hf_fake_write_token", user: str = "tester") -> None:
        self.token = token
        self.user = user
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.commits: list[dict[str, Any]] = []
        self.validated: list[str] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id].branches[revision].files)

    def api_calls(self) -> list[str]:
        """The request paths received, without query strings."""
        return [f"{method} {urlsplit(path).path}" for method, path in self.requests]

    # ---- the endpoints ----

    def create_repo(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        if payload.get("type") not in (None, "model"):
            return 400, {"error": "this fake Hub stores model repositories only"}
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
        repo = Repo(repo_id, private=payload.get("visibility") == "private")
        main = Branch(files={".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"})
        main.head = hashlib.sha1(f"init {repo_id}".encode()).hexdigest()
        repo.branches["main"] = main
        repo.snapshots[main.head] = Branch(dict(main.files), set(main.lfs), main.head)
        self.repos[repo_id] = repo
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

    def create_branch(self, repo: Repo, branch: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if branch in repo.branches:
            return 409, {"error": f"Reference already exists: refs/heads/{branch}"}
        start = repo.branches.get(payload.get("startingPoint") or "main")
        if start is None:
            return 404, {"error": "starting point not found"}
        repo.branches[branch] = Branch(dict(start.files), set(start.lfs), start.head)
        return 200, {}

    def validate_yaml(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from hf_geonorm.sharing.card_metadata import validate_card

        content = payload.get("content", "")
        self.validated.append(content)
        if not content.lstrip().startswith("---"):
            return 200, {"errors": [], "warnings": [{"message": "Empty metadata"}]}
        errors = validate_card(content, geonorm=False)
        return (400 if errors else 200), {"errors": [{"message": e} for e in errors], "warnings": []}

    def preupload(self, repo: Repo, branch: Branch, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        files = []
        for item in payload["files"]:
            path, size = item["path"], item["size"]
            lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
            oid = None
            if path in branch.files:
                data = branch.files[path]
                oid = hashlib.sha256(data).hexdigest() if path in branch.lfs else git_blob_sha1(data)
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return 200, {"files": files}

    def lfs_batch(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        objects = []
        for obj in payload["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs:
                entry["actions"] = {
                    "upload": {"href": f"{self.url}/lfs-upload/{obj['oid']}", "header": {}},
                    "verify": {"href": f"{self.url}/lfs-verify", "header": {}},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def lfs_upload(self, oid: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if hashlib.sha256(body).hexdigest() != oid:
            return 400, {"error": "the uploaded content does not match its sha256"}
        self.lfs[oid] = body
        return 200, {}

    def lfs_verify(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = self.lfs.get(payload.get("oid"))
        if data is None or len(data) != payload.get("size"):
            return 404, {"error": "object not uploaded"}
        return 200, {}

    def commit(self, repo: Repo, revision: str, body: bytes, create_pr: bool) -> tuple[int, dict[str, Any]]:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "the commit payload must start with its header"}
        header = lines[0]["value"]
        if create_pr:
            number = sum(name.startswith("refs/pr/") for name in repo.branches) + 1
            base = repo.branches[revision]
            revision = f"refs/pr/{number}"
            repo.branches[revision] = Branch(dict(base.files), set(base.lfs), base.head)
        branch = repo.branches[revision]
        files, lfs = dict(branch.files), set(branch.lfs)
        received: dict[str, dict[str, Any]] = {}
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    return 400, {"error": f"unknown encoding {value.get('encoding')!r}"}
                files[value["path"]] = base64.b64decode(value["content"])
                lfs.discard(value["path"])
                received[value["path"]] = {"mode": "regular"}
            elif key == "lfsFile":
                data = self.lfs.get(value["oid"])
                if data is None or value.get("algo") != "sha256" or len(data) != value.get("size", len(data)):
                    return 422, {"error": f"LFS object {value['oid']} for {value['path']} was not uploaded"}
                files[value["path"]] = data
                lfs.add(value["path"])
                received[value["path"]] = {"mode": "lfs", "oid": value["oid"]}
            elif key in ("deletedFile", "deletedFolder"):
                files.pop(value["path"], None)
                lfs.discard(value["path"])
            else:
                return 400, {"error": f"unknown commit operation {key!r}"}
        for path, entry in received.items():
            entry["sha256"] = hashlib.sha256(files[path]).hexdigest()
            entry["size"] = len(files[path])
        oid = hashlib.sha1(json.dumps([branch.head, header, sorted(received)]).encode()).hexdigest()
        branch.files, branch.lfs, branch.head = files, lfs, oid
        repo.snapshots[oid] = Branch(dict(files), set(lfs), oid)
        self.commits.append(
            {
                "repo_id": repo.repo_id,
                "revision": revision,
                "oid": oid,
                "summary": header.get("summary"),
                "description": header.get("description"),
                "parent": header.get("parentCommit"),
                "files": received,
            }
        )
        pr_url = f"{self.url}/{repo.repo_id}/discussions/{revision.rsplit('/', 1)[-1]}" if create_pr else None
        return 200, {
            "success": True,
            "commitOid": oid,
            "commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}",
            "hookOutput": "",
            "pullRequestUrl": pr_url,
        }

    def model_info(self, repo: Repo, branch: Branch) -> dict[str, Any]:
        return {
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": branch.head,
            "private": repo.private,
            "siblings": [{"rfilename": name} for name in sorted(branch.files)],
            "tags": [],
        }


REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
ROUTES = [
    ("POST", re.compile(r"^/api/repos/create$"), "create"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate"),
    ("POST", re.compile(rf"^/api/models/{REPO}/branch/(?P<rev>[^/]+)$"), "branch"),
    ("POST", re.compile(rf"^/api/models/{REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/models/{REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
    ("POST", re.compile(rf"^/{REPO}\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("PUT", re.compile(r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$"), "lfs_upload"),
    ("POST", re.compile(r"^/lfs-verify$"), "lfs_verify"),
    ("GET", re.compile(rf"^/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?$"), "info"),
    ("GET", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$"), "resolve"),
    ("HEAD", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)$"), "resolve"),
]
NEEDS_TOKEN = {"create", "branch", "preupload", "commit", "lfs_batch", "lfs_verify"}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, payload: Any = None, headers: dict[str, str] | None = None,
                  raw: bytes | None = None) -> None:  # fmt: skip
            body = raw if raw is not None else json.dumps(payload or {}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _dispatch(self) -> None:
            body = self._body() if self.command in ("POST", "PUT") else b""
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            if parts.path == "/api/agent-harnesses":  # huggingface_hub's agent detection: best effort, ignored
                return self._send(404, {"error": "not served here"})
            with hub.lock:
                hub.requests.append((self.command, self.path))
            for method, pattern, route in ROUTES:
                match = pattern.match(parts.path)
                if method == self.command and match:
                    name = route
                    break
            else:
                with hub.lock:
                    hub.unhandled.append((self.command, self.path))
                return self._send(400, {"error": f"the fake Hub does not know {self.command} {parts.path}"})
            if name in NEEDS_TOKEN and self.headers.get("Authorization") != f"Bearer {hub.token}":
                message = "Invalid credentials in Authorization header"
                return self._send(401, {"error": message}, {"X-Error-Message": message})
            groups = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
            with hub.lock:
                self._route(name, groups, body, query)

        def _route(self, name: str, groups: dict[str, str], body: bytes, query: dict[str, list[str]]) -> None:
            payload = json.loads(body) if body and name not in ("commit", "lfs_upload") else {}
            if name == "create":
                return self._send(*hub.create_repo(payload))
            if name == "validate":
                return self._send(*hub.validate_yaml(payload))
            if name == "lfs_upload":
                return self._send(*hub.lfs_upload(groups["oid"], body))
            if name == "lfs_verify":
                return self._send(*hub.lfs_verify(payload))
            repo = hub.repos.get(groups["repo"])
            if repo is None:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            if name == "lfs_batch":
                return self._send(*hub.lfs_batch(payload))
            if name == "branch":
                return self._send(*hub.create_branch(repo, groups["rev"], payload))
            branch = repo.branches.get(groups.get("rev", "main"))
            if branch is None and name in ("info", "resolve"):
                branch = repo.revision(groups["rev"])
            if branch is None:
                return self._send(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
            if name == "preupload":
                return self._send(*hub.preupload(repo, branch, payload))
            if name == "commit":
                return self._send(*hub.commit(repo, groups["rev"], body, query.get("create_pr") == ["1"]))
            if name == "info":
                return self._send(200, hub.model_info(repo, branch))
            data = branch.files.get(groups["file"])
            if data is None:
                return self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            headers = {"X-Repo-Commit": branch.head, "ETag": f'"{git_blob_sha1(data)}"'}
            if groups["file"] in branch.lfs:
                headers["X-Linked-Etag"] = f'"{hashlib.sha256(data).hexdigest()}"'
                headers["X-Linked-Size"] = str(len(data))
            return self._send(200, headers=headers, raw=data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._dispatch()

        def do_HEAD(self) -> None:  # noqa: N802
            self._dispatch()

        def do_POST(self) -> None:  # noqa: N802
            self._dispatch()

        def do_PUT(self) -> None:  # noqa: N802
            self._dispatch()

    return Handler
