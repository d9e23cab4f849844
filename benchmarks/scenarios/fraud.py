"""Fintech fraud routing: route a card authorisation from its transaction narrative."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from pcd_tools import decision

NAME = "fraud"
TITLE = "fintech fraud routing"
REFERENCE = {"fields": 4, "autoregressive_ms": 420, "pcd_ms": 75, "speedup": 5.6}


@decision
class FraudRouting(BaseModel):
    """Route a card-not-present authorisation for a retail bank's fraud operations team."""

    action: Literal["APPROVE", "STEP_UP_AUTH", "HOLD_FOR_REVIEW", "DECLINE"] = Field(
        description="What the authorisation engine should do with this transaction now",
        json_schema_extra={
            "choice_descriptions": {
                "APPROVE": "consistent with the cardholder's normal behaviour",
                "STEP_UP_AUTH": "plausible but needs 3-D Secure or an OTP challenge",
                "HOLD_FOR_REVIEW": "park it for an analyst before settlement",
                "DECLINE": "clear fraud signals; refuse the authorisation",
            }
        },
    )
    fraud_pattern: Literal[
        "NONE",
        "CARD_TESTING",
        "ACCOUNT_TAKEOVER",
        "STOLEN_CARD",
        "FRIENDLY_FRAUD",
        "MERCHANT_COLLUSION",
    ] = Field(description="The fraud typology the signals point to, if any")
    risk_tier: Literal["LOW", "MEDIUM", "HIGH", "CRITICAL"] = Field(
        description="Overall risk of loss for this transaction"
    )
    notify_cardholder: bool = Field(
        description="Whether to send the cardholder a push notification asking them to confirm"
    )


SCHEMA = FraudRouting

CONTEXT = """\
Authorisation request 7F3A-22915, 02:47 local time (Europe/Berlin).
Card: Visa Platinum ending 4417, issued 2019, cardholder Anna K., Hamburg. Typical
spend: groceries and fuel in Hamburg, one streaming subscription, average ticket EUR 46,
never more than EUR 400 in one purchase; no travel notice on file.
Transaction: EUR 2,389.00 at "ELECTRO-MAXX ONLINE" (MCC 5732, electronics), card not
present, shipping address in Vilnius, Lithuania, which differs from the billing address.
Device: new device fingerprint never seen on this account, browser language ru-RU,
IP geolocated to a hosting provider in the Netherlands flagged as a VPN exit node.
History in the last 40 minutes: the customer's online-banking password was reset via
email at 02:05, the registered phone number was changed at 02:11, and three
authorisations of EUR 1.00 at different donation sites were approved at 02:31-02:33.
The CVV was entered correctly; AVS returned a mismatch on street and postcode.
"""

CONTEXTS = (
    CONTEXT,
    """\
Authorisation 91C0-00412, 12:14 local time. Debit Mastercard ending 0921, cardholder
since 2015, salary credited monthly. Transaction: EUR 38.60 at "REWE Markt Eppendorf"
(MCC 5411), chip and PIN, terminal 300 m from the cardholder's home; the same store
appears 3-4 times a week in the last six months. Device and location match the mobile
banking app's last login 20 minutes ago. No recent changes to the account.""",
    """\
Authorisation 5521-77A03, 09:02. Amex ending 3005 on a small-business account. In the
last 6 minutes 41 authorisations of USD 0.50-2.00 were attempted at one e-commerce
merchant (MCC 5999) with sequential card numbers from the same BIN range, 38 declined
for invalid CVV. This request: USD 1.00, card not present, CVV correct, same IP and
user agent as the failed attempts.""",
)
