"""Error mapping: the API's error body, Retry-After, foreign bodies."""

from __future__ import annotations

import email.utils
import json
import time
import unittest

import airlock
from airlock import _errors


def body(code: str, message: str = "m", **kw: str) -> bytes:
    d = {"code": code, "message": message}
    d.update(kw)
    return json.dumps({"error": d}).encode()


class Headers(dict):
    def get(self, k, default=None):  # case-insensitive, as http.client's
        for kk, v in self.items():
            if kk.lower() == k.lower():
                return v
        return default


class ErrorMappingTest(unittest.TestCase):
    def test_codes_map_to_their_classes(self) -> None:
        cases = {
            "sandbox_not_found": airlock.SandboxNotFound,
            "exec_not_found": airlock.ExecNotFound,
            "template_not_found": airlock.TemplateNotFound,
            "not_found": airlock.NotFound,
            "invalid_argument": airlock.InvalidRequest,
            "unauthenticated": airlock.Unauthorized,
            "permission_denied": airlock.PermissionDenied,
            "quota_exceeded": airlock.QuotaExceeded,
            "rate_limited": airlock.RateLimited,
            "invalid_state": airlock.InvalidState,
            "template_building": airlock.TemplateBuilding,
            "capacity_exhausted": airlock.CapacityExhausted,
            "runtime_unavailable": airlock.RuntimeUnavailable,
        }
        for code, cls in cases.items():
            e = _errors.from_response(418, Headers(), body(code))
            self.assertIs(type(e), cls, code)
            self.assertIsInstance(e, airlock.AirlockError)
            self.assertEqual(e.code, code)
            self.assertEqual(e.status, 418)

    def test_kinds(self) -> None:
        # The specific classes are kinds of the general ones, so
        # `except NotFound` catches a missing sandbox.
        self.assertTrue(issubclass(airlock.SandboxNotFound, airlock.NotFound))
        self.assertTrue(issubclass(airlock.InvalidState, airlock.Conflict))
        self.assertTrue(issubclass(airlock.CapacityExhausted, airlock.Unavailable))
        self.assertTrue(issubclass(airlock.TransportError, airlock.Unavailable))
        self.assertFalse(issubclass(airlock.QuotaExceeded, airlock.RateLimited))
        for name in airlock.__all__:
            obj = getattr(airlock, name)
            if isinstance(obj, type) and issubclass(obj, Exception):
                self.assertTrue(issubclass(obj, airlock.AirlockError), name)

    def test_fields_and_message(self) -> None:
        e = _errors.from_response(
            404, Headers({"X-Request-Id": "req_hdr"}),
            body("sandbox_not_found", "sandbox not found", request_id="req_body", sandbox_id="sbx_1"),
        )
        self.assertEqual((e.message, e.request_id, e.sandbox_id), ("sandbox not found", "req_body", "sbx_1"))
        self.assertEqual(str(e), "sandbox not found (sandbox_not_found)")
        self.assertIsNone(e.retry_after)
        self.assertFalse(e.retryable)
        e = _errors.from_response(404, Headers({"X-Request-Id": "req_hdr"}), body("not_found"))
        self.assertEqual(e.request_id, "req_hdr")

    def test_retry_after(self) -> None:
        e = _errors.from_response(429, Headers({"Retry-After": "7"}), body("quota_exceeded"))
        self.assertIsInstance(e, airlock.QuotaExceeded)
        self.assertEqual(e.retry_after, 7.0)
        self.assertTrue(e.retryable)
        later = email.utils.formatdate(time.time() + 120, usegmt=True)
        e = _errors.from_response(503, Headers({"retry-after": later}), body("capacity_exhausted"))
        self.assertIsNotNone(e.retry_after)
        self.assertTrue(100 < e.retry_after <= 120, e.retry_after)
        self.assertIsNone(_errors.parse_retry_after("soon"))
        self.assertEqual(_errors.parse_retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)), 0.0)

    def test_unknown_code_is_the_base_class(self) -> None:
        e = _errors.from_response(409, Headers(), body("brand_new_code", "newer server"))
        self.assertIs(type(e), airlock.AirlockError)
        self.assertEqual((e.code, e.status, e.message), ("brand_new_code", 409, "newer server"))

    def test_foreign_body_by_status(self) -> None:
        html = b"<html>\n<h1>502 Bad Gateway</h1>" + b"x" * 500
        e = _errors.from_response(502, Headers(), html)
        self.assertIs(type(e), airlock.Unavailable)
        self.assertEqual(e.code, "unavailable")
        self.assertEqual(e.message, "<html>")
        self.assertTrue(e.retryable)
        e = _errors.from_response(404, Headers(), b"")
        self.assertIs(type(e), airlock.NotFound)
        self.assertEqual(e.message, "HTTP 404")
        e = _errors.from_response(400, Headers(), b'{"error": "just a string"}')
        self.assertIs(type(e), airlock.InvalidRequest)
        long_line = _errors.from_response(500, Headers(), b"y" * 1000)
        self.assertEqual(len(long_line.message), 200)

    def test_stream_error(self) -> None:
        e = _errors.from_stream_error(json.dumps({"error": {"code": "agent_unavailable", "message": "gone"}}))
        self.assertIs(type(e), airlock.AgentUnavailable)
        self.assertEqual(e.status, 0)
        e = _errors.from_stream_error(json.dumps({"code": "sandbox_not_found", "message": "x"}))
        self.assertIs(type(e), airlock.SandboxNotFound)
        self.assertIs(type(_errors.from_stream_error("not json")), airlock.InternalError)

    def test_exec_timeout_keeps_result(self) -> None:
        r = airlock.CommandResult(exec_id="ex_1", exit_code=None, status="timeout", stdout_bytes=b"partial")
        e = airlock.ExecTimeout("command timed out after 2s", result=r, sandbox_id="sbx_1")
        self.assertEqual(e.code, "exec_timeout")
        self.assertEqual(e.result.stdout, "partial")
        self.assertIsInstance(e, airlock.AirlockError)


if __name__ == "__main__":
    unittest.main()
