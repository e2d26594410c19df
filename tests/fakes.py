"""
Servers on 127.0.0.1 that stand in for the Hugging Face Hub and TinyImageNet's host, so
that the real download code runs without network.

`FileServer` serves byte strings at paths (GET and HEAD, ``Range`` requests) with the
headers `huggingface_hub` reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``), and
can misbehave on purpose: cut a transfer short, stop sending mid-file, announce a wrong
size or an etag that is not its bytes', hold two downloads until both have started,
go offline. `CHILD_FAKES` is the file system's part: a ``sitecustomize`` module for
the download's child processes (``flock`` that fails, or locks nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import socket
import threading
import time
import zipfile

from PIL import Image

COMMIT = "0" * 40


class FileServer:
    """
    Serve ``files`` (path -> bytes) on 127.0.0.1 in a background thread.

    Attributes
    ----------
    cut_next : dict
        path -> number of bytes after which the next GET of that path is cut short
        (the connection closes with fewer bytes than announced); used once. A list
        of numbers: one per GET, in order.
    stall_next : dict
        path -> number of bytes (or a list: one per GET) after which the next GET of
        that path stops sending, the connection left open, until the server stops:
        a transfer that stalls (xet-core #800, #883: Xet transfers of
        huggingface_hub 0.36 that hang without an error; on its HTTP path `http_get`
        gives up a read after 10 s, ``HF_HUB_DOWNLOAD_TIMEOUT``).
    pace : dict
        path -> (bytes, seconds): the body is sent that many bytes at a time with
        that pause between, so that two transfers overlap.
    together : dict
        path -> n: the body of a GET of that path is sent only once n GETs of it
        have arrived (at most 10 s): two downloads at once, as two runs sharing a
        cache start them (huggingface_hub #4306).
    etags : dict
        path -> the etag sent instead of the SHA-256 of the bytes: a server, or a
        proxy on the way, whose bytes are not the file the Hub names.
    announce : dict
        path -> size announced in ``Content-Length`` instead of the true one.
    requests : list
        (method, path, Range header) of every request, in order.
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.cut_next: dict[str, int | list[int]] = {}
        self.stall_next: dict[str, int | list[int]] = {}
        self.pace: dict[str, tuple[int, float]] = {}
        self.together: dict[str, int] = {}
        self.etags: dict[str, str] = {}
        self.announce: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.stopping = threading.Event()
        self.arrived = threading.Condition()
        self.connections: set = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                server.connections.add(self.connection)

            def finish(self):
                server.connections.discard(self.connection)
                super().finish()

            def _serve(self, body: bool):
                path = self.path.split("?", 1)[0]
                server.requests.append((self.command, path, self.headers.get("Range")))
                data = server.files.get(path)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-", 1)[0] or 0)
                if start and start >= len(data):  # as real servers (RFC 9110 14.4)
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                part = data[start:]
                self.send_response(206 if start else 200)
                size = server.announce.get(path, len(part))
                self.send_header("Content-Length", str(size))
                etag = server.etags.get(path) or hashlib.sha256(data).hexdigest()
                self.send_header("ETag", f'"{etag}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                if start:
                    end = len(data) - 1
                    self.send_header(
                        "Content-Range", f"bytes {start}-{end}/{len(data)}"
                    )
                self.end_headers()
                if not body:
                    return
                with server.arrived:
                    server.arrived.notify_all()
                    server.arrived.wait_for(
                        lambda: self._gets(path) >= server.together.get(path, 0),
                        timeout=10,
                    )
                cut = _next(server.cut_next, path)
                stall = _next(server.stall_next, path)
                end = min(n for n in (cut, stall, len(part)) if n is not None)
                every, pause = server.pace.get(path, (len(part) or 1, 0.0))
                for at in range(0, end, every):
                    self.wfile.write(part[at : min(at + every, end)])
                    if pause:
                        self.wfile.flush()
                        time.sleep(pause)
                if stall is not None:
                    self.wfile.flush()
                    server.stopping.wait(timeout=120)
                if cut is not None or stall is not None or size != len(part):
                    self.wfile.flush()
                    self.close_connection = True

            def _gets(self, path: str) -> int:
                return sum(1 for r in server.requests if r[:2] == ("GET", path))

            def do_GET(self):
                self._serve(body=True)

            def do_HEAD(self):
                self._serve(body=False)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def stop(self):
        """
        Go offline: stop listening and close the connections clients keep open
        (`requests` reuses one for the next request, so that a server that only
        stopped listening would still answer them).
        """
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for conn in list(self.connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __exit__(self, *exc):
        self.stop()


def _next(plan: dict, path: str) -> int | None:
    """The next planned number of bytes for `path` (an int: once; a list: in
    order), taken out of `plan`."""
    value = plan.get(path)
    if isinstance(value, list):
        value = value.pop(0) if value else None
        if not plan[path]:
            del plan[path]
        return value
    return plan.pop(path, None)


#: The download's child processes (`multigeom_workflow.inputs.hub` runs each try of
#: `hf_hub_download` in one) run this as their ``sitecustomize`` module, written by
#: a test into a folder put first on ``PYTHONPATH``. ``MULTIGEOM_TEST_FLOCK``:
#: ``nosys`` copies NFS mounted without locking and Lustre without ``flock``, where
#: `fcntl.flock` fails with ENOSYS (huggingface_hub #2399) and filelock 4.3 falls
#: back to its `SoftFileLock`, whose marker file is the lock (``_native/_unix.py``,
#: `_fallback_to_soft_lock`), so that an empty marker left by a killed download
#: blocks every later one (huggingface_hub #2543); ``noop`` copies Lustre, GPFS and
#: some NFS mounts where ``flock`` succeeds and locks nothing (huggingface_hub
#: #4306). ``MULTIGEOM_TEST_CHILD_RECORD``: a file to which each child appends its
#: ``HF_HUB_DISABLE_XET``, one line each.
CHILD_FAKES = """
import os

_flock = os.environ.get("MULTIGEOM_TEST_FLOCK")
if _flock:
    import errno
    import fcntl

    def _fake_flock(fd, operation):
        if _flock == "nosys":
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    fcntl.flock = _fake_flock
_record = os.environ.get("MULTIGEOM_TEST_CHILD_RECORD")
if _record:
    with open(_record, "a") as f:
        f.write(os.environ.get("HF_HUB_DISABLE_XET", "") + "\\n")
"""


def hub_path(repo_id: str, filename: str, revision: str = "main") -> str:
    """The path the Hub serves a file at: ``/<repo>/resolve/<revision>/<file>``."""
    return f"/{repo_id}/resolve/{revision}/{filename}"


def tinyimagenet_zip(n_images: int = 12) -> bytes:
    """
    A TinyImageNet-like archive: ``tiny-imagenet-200/val/images/val_<i>.JPEG`` for i <
    `n_images` (8 x 8 colour images, each of its own shade), ``wnids.txt``, and
    ``val_annotations.txt``.
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "n01443537\n")
        lines = []
        for i in range(n_images):
            img = io.BytesIO()
            Image.new("RGB", (8, 8), color=(i * 20 % 256, 100, 255 - i)).save(
                img, format="JPEG"
            )
            z.writestr(f"tiny-imagenet-200/val/images/val_{i}.JPEG", img.getvalue())
            lines.append(f"val_{i}.JPEG\tn01443537\t0\t0\t8\t8")
        z.writestr("tiny-imagenet-200/val/val_annotations.txt", "\n".join(lines))
    return buf.getvalue()
