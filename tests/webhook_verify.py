#!/usr/bin/env python3
"""Verifies webhook deliveries with the Standard Webhooks reference package for Python
(`pip install standardwebhooks`), an implementation independent of ours.

Usage: webhook_verify.py CASES.json, where the file holds {"secret": "whsec_...", "cases":
[{"id", "timestamp", "signature", "body"}, ...]}. Prints "<n> verified"; exits 1 naming the
first delivery that does not verify.
"""
import json
import sys

from standardwebhooks.webhooks import Webhook

spec = json.load(open(sys.argv[1]))
hook = Webhook(spec["secret"])
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
