#!/usr/bin/env python3
"""Verifies webhook deliveries with the Standard Webhooks reference package for Python
(`pip install standardwebhooks`), an implementation independent of ours.

Usage: webhook_verify.py CASES.json, where the file holds {"secret": "whsec_...", "cases":
[{"id", "timestamp", "signature", "body"}, ...]} and optionally "tenant": then the deliveries
are verified with that tenant's secret, derived from "secret" as docs/http-api.md says (written here
again, not taken from the product): HMAC-SHA256 under the secret's bytes of
"aptix-webhook-tenant", a NUL and the tenant's name. Prints "<n> verified"; exits 1 naming
the first delivery that does not verify.
"""
import base64
import hashlib
import hmac
import json
import sys

from standardwebhooks.webhooks import Webhook

spec = json.load(open(sys.argv[1]))
secret = spec["secret"]
if spec.get("tenant"):
    raw = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(raw, b"aptix-webhook-tenant\0" + spec["tenant"].encode(), hashlib.sha256)
    secret = "whsec_" + base64.b64encode(mac.digest()).decode()
hook = Webhook(secret)
for i, case in enumerate(spec["cases"]):
    headers = {
        "webhook-id": case["id"],
        "webhook-timestamp": case["timestamp"],
        "webhook-signature": case["signature"],
    }
    try:
        hook.verify(case["body"], headers)
    except Exception as e:  # the package raises its own WebhookVerificationError
        print(f"delivery {i} ({case['id']}) does not verify: {e}")
        sys.exit(1)
print(f"{len(spec['cases'])} verified")
