"""The long-input sweep's input text (`pcd_tools.bench.long_inputs`): support / email threads
of exactly N context tokens under a model's tokenizer.

`thread_messages` writes an endless, deterministic thread (customer messages, agent replies
and internal notes); `build_context` cuts one at a token count, decoded and checked by
encoding again.
"""

from __future__ import annotations

import datetime
import random
import re
from collections.abc import Callable, Iterator

__all__ = ["build_context", "thread_messages"]

PEOPLE = [
    ("Dana Whitfield", "northwind-logistics.com"),
    ("Marek Novak", "brightlane.eu"),
    ("Priya Raman", "tessera-health.com"),
    ("Tom Okafor", "kestrel-retail.co.uk"),
    ("Lucia Ferreira", "solvia-energy.pt"),
    ("Ben Hartley", "quarry-media.com"),
    ("Aiko Tanaka", "hoshi-labs.jp"),
    ("Sam Delgado", "copperfield-bank.com"),
]
AGENTS = ["Jordan (Support)", "Elena (Tier 2)", "Chris (Billing)", "Maya (Solutions Engineer)"]
PRODUCTS = ["dashboard exports", "the REST API", "SSO login", "the data pipeline", "webhooks"]
SUBJECTS = [
    "Scheduled exports failing since the last release",
    "Invoice INV-{n} charged twice",
    "Users stuck in an SSO redirect loop",
    "API requests returning 429 well under our quota",
    "Nightly pipeline finishing hours late",
    "Question about renewing our contract",
    "Webhook deliveries retried and duplicated",
]
BODIES = [
    "We noticed that {product} stopped working for part of our team on {day}. About {k} of "
    "our {m} users are affected, mostly in the {region} office. Nothing changed on our side "
    "as far as I can tell: same browsers, same network, same accounts.",
    "I attached the request IDs you asked for: {ids}. All of them failed between {t1} and "
    "{t2} UTC. The error message says '{error}', which does not tell us much.",
    "Our finance team sees two charges of ${amount} on the card ending in {card} for the same "
    "billing period. Could you confirm whether one of them will be refunded, and when?",
    "This is now blocking our month-end reporting. Our CFO expects the numbers on {day} and we "
    "cannot produce them without {product}. Please treat this as urgent.",
    "For context, we are on the Enterprise plan with {m} seats and a 99.9% uptime SLA. Our "
    "account manager is {agent_first}, in case you need to loop them in.",
    "We tried the workaround from your status page (clearing the cache and signing in again) "
    "but it only helped for about {k} minutes before the problem came back.",
    "Separately, we would like to know whether {product} can be configured per workspace. "
    "It is not urgent, but it came up in our quarterly review.",
    "Our security team asks whether any customer data was exposed while this was happening, "
    "and whether you can share an incident report once it is resolved.",
    "I am also copying {cc}, who owns the integration on our side and can answer technical "
    "questions faster than I can.",
]
REPLIES = [
    "Thanks for the details, {name_first}. I have reproduced the issue with {product} on our "
    "side and escalated it to engineering as ticket #{n}. I will update you as soon as I hear "
    "back, at the latest by {day}.",
    "Could you send us the exact time of one failed attempt and the workspace ID? With those "
    "we can pull the server logs for your account. In the meantime, retrying after {k} "
    "minutes should work for most requests.",
    "I checked your billing history: the second charge of ${amount} is a pre-authorisation "
    "that our payment provider releases within {k} business days. If it is still there on "
    "{day}, reply here and I will refund it manually.",
    "Our engineers found the cause: a configuration change on {day} lowered a limit for "
    "accounts in the {region} region. A fix is rolling out now and should reach your "
    "workspace within {k} hours.",
    "I understand the impact on your reporting. I have raised the priority, and {agent_first} "
    "from our solutions team will join the thread to help with a temporary export.",
]
NOTES = [
    "Internal note: customer confirmed on a call that {k} dashboards are affected. Logs show "
    "'{error}' from worker {worker}. Linked to incident INC-{n}.",
    "Log excerpt ({day}):\n  {t1}Z WARN  {worker} job={n} retry=1 status=503\n  {t2}Z ERROR "
    '{worker} job={n} retry=3 status=500 msg="{error}"',
]
ERRORS = [
    "upstream connect error or disconnect/reset before headers",
    "export job exceeded the 600 s limit",
    "SAML response signature mismatch",
    "rate limit exceeded for key",
    "deadlock detected while writing partition",
]
REGIONS = ["Frankfurt", "Dublin", "Virginia", "Singapore", "Sao Paulo"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _fill(template: str, rng: random.Random, who: tuple[str, str]) -> str:
    other = rng.choice(PEOPLE)
    return template.format(
        product=rng.choice(PRODUCTS),
        day=rng.choice(DAYS),
        k=rng.randint(2, 40),
        m=rng.choice([50, 120, 300, 850, 2400]),
        n=rng.randint(10000, 99999),
        region=rng.choice(REGIONS),
        ids=", ".join(f"req_{rng.randrange(16**8):08x}" for _ in range(rng.randint(2, 4))),
        t1=f"{rng.randint(0, 11):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        t2=f"{rng.randint(12, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
        error=rng.choice(ERRORS),
        amount=f"{rng.randint(200, 9000):,}.{rng.randint(0, 99):02d}",
        card=rng.randint(1000, 9999),
        agent_first=rng.choice(AGENTS).split()[0],
        name_first=who[0].split()[0],
        cc=f"{other[0]} <{other[0].split()[0].lower()}@{who[1]}>",
        worker=f"export-worker-{rng.randint(1, 9)}",
    )


def thread_messages(text: int) -> Iterator[str]:
    """An endless, deterministic email thread (text number `text`): customer messages,
    agent replies and internal notes in turn, each with headers and a quoted line."""
    rng = random.Random(1009 * text + 17)
    who = PEOPLE[text % len(PEOPLE)]
    subject = rng.choice(SUBJECTS).format(n=rng.randint(10000, 99999))
    ticket = rng.randint(100000, 999999)
    start = datetime.datetime(2025, 10, 1 + text % 20, 8, 30)
    last = ""
    i = 0
    while True:
        kind = ("customer", "agent", "customer", "note")[i % 4] if i else "customer"
        when = start + datetime.timedelta(hours=5 * i, minutes=(37 * i) % 60)
        stamp = when.strftime("%a, %d %b %Y %H:%M")
        if kind == "customer":
            first = who[0].split()[0]
            head = f"From: {who[0]} <{first.lower()}@{who[1]}>\nTo: support@acme-analytics.io"
            paras = [_fill(b, rng, who) for b in rng.sample(BODIES, rng.randint(2, 3))]
            body = "Hi team,\n\n" + "\n\n".join(paras) + f"\n\nThanks,\n{first}"
        elif kind == "agent":
            agent = rng.choice(AGENTS)
            head = f"From: {agent} <support@acme-analytics.io>\nTo: {who[0]}"
            body = f"Hi {who[0].split()[0]},\n\n{_fill(rng.choice(REPLIES), rng, who)}\n\nBest regards,\n{agent}"
        else:
            head = "From: Acme Support (internal)\nTo: tier2@acme-analytics.io"
            body = _fill(rng.choice(NOTES), rng, who)
        said = [p for p in last.split("\n\n")[1:-1] if p]  # the last message's own words
        first_sentence = re.match(r"(.+?[.?!])(\s|$)", said[0], re.S) if said else None
        quote = f"\n\n> {first_sentence.group(1)}" if first_sentence else ""
        msg = f"{head}\nDate: {stamp}\nSubject: {'Re: ' if i else ''}[#{ticket}] {subject}\n\n{body}{quote}\n\n"
        last = body
        i += 1
        yield msg


def build_context(
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    tokens: int,
    text: int = 0,
    round_: int = 0,
) -> tuple[str, int]:
    """A support thread of exactly `tokens` context tokens under `encode` (when the
    tokenizer allows; else the nearest count found).

    Args:
        encode: The model's tokenizer, text to ids (no BOS: `engine.encode_ids`).
        decode: Ids to text.
        tokens: The length wanted.
        text: Which thread (different texts per length).
        round_: The leading reference line's number (a new context every round).

    Returns:
        The text and its token count, `len(encode(text))`.
    """
    lead = f"Ticket export LT-{text:02d}-{round_ + 1:03d} (forwarded to the routing agent)\n\n"
    parts = [lead]
    msgs = thread_messages(text)
    chars, want = len(lead), 5 * (tokens + 16)  # about 4 characters a token
    while True:  # enough text, with room to cut
        while chars < want:
            parts.append(next(msgs))
            chars += len(parts[-1])
        ids = encode("".join(parts))
        if len(ids) >= tokens + 16:
            break
        want *= 2
    best: tuple[int, str] | None = None
    for d in (0, -1, 1, -2, 2, -3, 3, -4, 4, -6, 6, -8, 8):  # a cut that re-encodes exactly
        candidate = decode(ids[: tokens + d])
        n = len(encode(candidate))
        if n == tokens:
            return candidate, n
        if best is None or abs(n - tokens) < abs(best[0] - tokens):
            best = (n, candidate)
    assert best is not None
    return best[1], best[0]
