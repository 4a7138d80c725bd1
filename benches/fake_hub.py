#!/usr/bin/env python3
"""A fake Hugging Face Hub on loopback for the remote benchmark: fake_hub.py FOLDER PORT DELAY LOG

Serves the files of FOLDER as the repository `bench/model` at one commit: the metadata call
(`/api/models/bench/model/revision/REV`), `resolve` (a `.safetensors` file redirected to the
second host name, `localhost`, as the Hub redirects to its CDN; other files answered directly),
and byte ranges there, read from the files (sparse files cost no disk). Every answer waits
DELAY seconds first (the round trip); every request is appended to LOG. Listens on 127.0.0.1 only.
"""
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FOLDER, PORT, DELAY, LOG = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LOCK = threading.Lock()


def blob(path):
    digest = hashlib.sha256(path.encode()).hexdigest()
    return digest if path.endswith(".safetensors") else digest[:40]


class Hub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, headers=(), body=b""):
        time.sleep(DELAY)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with LOCK, open(LOG, "a") as log:
            log.write(f"{self.headers.get('Host')} {self.path} {self.headers.get('Range', '-')}\n")
        path = self.path.split("?")[0]
        if path.startswith("/api/models/bench/model"):
            siblings = []
            for name in sorted(os.listdir(FOLDER)):
                size = os.path.getsize(os.path.join(FOLDER, name))
                sibling = {"rfilename": name, "size": size, "blobId": blob(name)[:40]}
                if name.endswith(".safetensors"):
                    sibling["lfs"] = {"sha256": blob(name), "size": size, "pointerSize": 134}
                siblings.append(sibling)
            body = json.dumps({"id": "bench/model", "sha": COMMIT, "siblings": siblings}).encode()
            return self.reply(200, [("Content-Type", "application/json")], body)
        prefix = f"/bench/model/resolve/{COMMIT}/"
        if path.startswith(prefix):
            name = path[len(prefix):]
            file = os.path.join(FOLDER, name)
            if not os.path.isfile(file):
                return self.reply(404, [("X-Error-Code", "EntryNotFound")])
            if name.endswith(".safetensors"):
                location = f"http://localhost:{PORT}/cdn/{name}"
                return self.reply(302, [("Location", location), ("X-Repo-Commit", COMMIT)])
            with open(file, "rb") as f:
                return self.reply(200, [("ETag", f'"{blob(name)}"')], f.read())
        if path.startswith("/cdn/"):
            name = path[len("/cdn/"):]
            file = os.path.join(FOLDER, name)
            total = os.path.getsize(file)
            first, last = self.headers["Range"][len("bytes="):].split("-")
            first, last = int(first), min(int(last), total - 1)
            with open(file, "rb") as f:
                f.seek(first)
                body = f.read(last - first + 1)
            headers = [("ETag", f'"{blob(name)}"'), ("Content-Range", f"bytes {first}-{last}/{total}")]
            return self.reply(206, headers, body)
        return self.reply(404)


ThreadingHTTPServer.daemon_threads = True
# Room for every connection a client opens at once (the default, 5, drops the rest until they retry).
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("127.0.0.1", PORT), Hub).serve_forever()
