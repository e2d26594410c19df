"""
Servers on 127.0.0.1 that stand in for the Hugging Face Hub and TinyImageNet's host, so
that the real download code runs without network.

`FileServer` serves byte strings at paths (GET and HEAD, ``Range`` requests) with the
headers `huggingface_hub` reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``), and
can misbehave on purpose: cut a transfer short, announce a wrong size.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
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
        (the connection closes with fewer bytes than announced); used once.
    announce : dict
        path -> size announced in ``Content-Length`` instead of the true one.
    requests : list
        (method, path, Range header) of every request, in order.
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.cut_next: dict[str, int] = {}
        self.announce: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

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
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
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
                cut = server.cut_next.pop(path, None)
                self.wfile.write(part if cut is None else part[:cut])
                if cut is not None or size != len(part):
                    self.wfile.flush()
                    self.close_connection = True

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

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


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
