"""Code security audit: review a pull-request diff before it merges."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from pcd_tools import decision

NAME = "security_audit"
TITLE = "code security audit"
REFERENCE = {"fields": 4, "autoregressive_ms": 380, "pcd_ms": 68, "speedup": 5.6}


@decision
class SecurityAudit(BaseModel):
    """Audit a pull-request diff for security vulnerabilities before it is merged."""

    vulnerability: Literal[
        "NONE",
        "SQL_INJECTION",
        "XSS",
        "PATH_TRAVERSAL",
        "COMMAND_INJECTION",
        "SSRF",
        "INSECURE_DESERIALIZATION",
        "HARDCODED_SECRET",
        "BROKEN_ACCESS_CONTROL",
    ] = Field(description="The most serious vulnerability class the diff introduces")
    severity: Literal["INFO", "LOW", "MEDIUM", "HIGH", "CRITICAL"] = Field(
        description="CVSS-style severity of that vulnerability in this service"
    )
    remotely_exploitable: bool = Field(
        description="Whether an unauthenticated attacker on the network could trigger it"
    )
    verdict: Literal["APPROVE", "REQUEST_CHANGES", "BLOCK_MERGE"] = Field(
        description="What the reviewer should do with the pull request"
    )


SCHEMA = SecurityAudit

CONTEXT = '''\
PR #1842 "Add invoice search to the billing API" (service: billing-api, public internet)

--- a/billing/api/invoices.py
+++ b/billing/api/invoices.py
@@ -12,6 +12,19 @@ from billing.db import get_connection
 router = APIRouter(prefix="/v1/invoices")

+@router.get("/search")
+def search_invoices(customer: str, status: str = "open"):
+    """Search invoices by customer name; no auth needed, used by the public status page."""
+    conn = get_connection()
+    query = (
+        "SELECT id, customer, amount_cents, status FROM invoices "
+        f"WHERE customer LIKE '%{customer}%' AND status = '{status}' "
+        "ORDER BY created_at DESC LIMIT 50"
+    )
+    rows = conn.execute(query).fetchall()
+    return [dict(r) for r in rows]
+
 @router.get("/{invoice_id}")
 def get_invoice(invoice_id: int, user=Depends(require_user)):
'''

CONTEXTS = (
    CONTEXT,
    """\
PR #1850 "Let admins download exported reports" (service: reports, internal VPN only)

+@app.get("/exports/<name>")
+@login_required
+def download_export(name):
+    path = os.path.join(EXPORT_DIR, name)
+    return send_file(path, as_attachment=True)
""",
    """\
PR #1857 "Rename variables in the currency formatter"

-def fmt(a, c):
-    return f"{a / 100:.2f} {c}"
+def format_amount(amount_cents: int, currency: str) -> str:
+    return f"{amount_cents / 100:.2f} {currency}"
""",
)
