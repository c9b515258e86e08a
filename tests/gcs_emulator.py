"""gcp-storage-emulator (PyPI) on 127.0.0.1, with GCS's generation preconditions in front of it.

The emulator ignores `ifGenerationMatch`/`ifGenerationNotMatch` (checked on 2026.7.19: a second
upload with ifGenerationMatch=0 overwrote the object, a delete with a wrong generation deleted it),
so on it two runners would both "create" the lock. GCS documents
(https://cloud.google.com/storage/docs/request-preconditions): ifGenerationMatch=0 succeeds only if
no live object exists; ifGenerationMatch=N only if the live object's generation is N; otherwise
412 Precondition Failed (reason conditionNotMet); a read or delete of a missing object is 404 first.
This layer evaluates them before the emulator's handler runs. The emulator's HTTP server is
single-threaded, so the check and the write are one atomic step, as on GCS."""

from __future__ import annotations

import re
import threading
from functools import partial
from http import HTTPStatus, server
from urllib.parse import unquote

from gcp_storage_emulator import server as emu
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.storage import Storage

_OBJECT = re.compile(r"^(?:/download)?/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>.+)$")
_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o$")


class _Handler(emu.RequestHandler):
    def _route(self, method: str) -> None:
        override = self.headers.get("x-http-method-override")
        method = override or method
        request, response = emu.Request(self, method), emu.Response(self)
        failed = self._precondition_failed(request)
        if failed is not None:
            response.status = failed
            if failed == HTTPStatus.PRECONDITION_FAILED:
                response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
                                         "errors": [{"reason": "conditionNotMet", "domain": "global"}]}})
            response.close()
            return
        for regex, handlers in emu.HANDLERS:
            match = re.compile(regex).fullmatch(request.path)
            if match:
                request.set_match(match)
                handler = handlers.get(method)
                if handler is None:
                    response.status = HTTPStatus.NOT_IMPLEMENTED
                else:
                    handler(request, response, self.storage)
                break
        else:
            response.status = HTTPStatus.NOT_IMPLEMENTED
        response.close()

    def _precondition_failed(self, request) -> HTTPStatus | None:
        query = request.query
        if "ifGenerationMatch" not in query and "ifGenerationNotMatch" not in query:
            return None
        path = request.path
        m = _OBJECT.match(path)
        if m:
            bucket, name = m["bucket"], unquote(m["name"])
        elif (m := _UPLOAD.match(path)) is not None:
            bucket = m["bucket"]
            data = request.data
            meta = data.get("meta", {}) if isinstance(data, dict) else {}
            name = query["name"][0] if "name" in query else (meta or {}).get("name")
        else:
            return None
        try:
            current = int(self.storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            current = None
        if current is None and request.method in ("GET", "DELETE"):
            return HTTPStatus.NOT_FOUND
        live = current if current is not None else 0
        if "ifGenerationMatch" in query and int(query["ifGenerationMatch"][0]) != live:
            return HTTPStatus.PRECONDITION_FAILED
        if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"][0]) == live:
            return HTTPStatus.PRECONDITION_FAILED if request.method != "GET" else HTTPStatus.NOT_MODIFIED
        return None

    def do_GET(self):
        self._route(emu.GET)

    def do_POST(self):
        self._route(emu.POST)

    def do_DELETE(self):
        self._route(emu.DELETE)

    def do_PUT(self):
        self._route(emu.PUT)

    def do_PATCH(self):
        self._route(emu.PATCH)

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


class GcsEmulator:
    """The emulator in memory, served on a free port: `url` is what STORAGE_EMULATOR_HOST takes."""

    def __init__(self):
        self.storage = Storage(use_memory_fs=True)
        self._httpd = server.HTTPServer(("127.0.0.1", 0), partial(_Handler, self.storage))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> GcsEmulator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
