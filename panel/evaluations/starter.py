"""The built-in starter set: the kinds of answers a team usually needs a cheaper model to still get right (JSON that
parses and fits its shape, a value extracted exactly, a format, a short fact), one case or two of each, so a team
can score a candidate before writing its own set. Every check here is machine-run: no reference or judge channel."""
import json

NAME = "Starter: JSON, extraction and formats"
DESCRIPTION = ("Twelve everyday cases to start from: JSON objects that must parse and fit a schema, values "
               "extracted exactly, dates and codes in a set format, short facts. Copy it and make it yours.")
JSON_ONLY = "Answer with one JSON object and nothing else."

INVOICE_SCHEMA = {"type": "object", "required": ["invoice", "total", "currency"],
                  "properties": {"invoice": {"type": "string"}, "total": {"type": "number"},
                                 "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
CONTACT_SCHEMA = {"type": "object", "required": ["name", "email"],
                  "properties": {"name": {"type": "string", "minLength": 1},
                                 "email": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$"}}}
SENTIMENT_SCHEMA = {"type": "object", "required": ["sentiment"],
                    "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}}}

CASES = [
    {"id": "invoice-json", "system": JSON_ONLY,
     "prompt": "Invoice INV-2041 from Acme GmbH: 3 licences at 120.50 EUR each, total 361.50 EUR. Give invoice, "
               "total and currency.",
     "checks": [{"type": "json_schema", "schema": INVOICE_SCHEMA}, {"type": "contains", "text": "361.5"}]},
    {"id": "contact-json", "system": JSON_ONLY,
     "prompt": "From this signature, give name and email: 'Best, Dana Whitfield | dana.w@example.org | +44 20 7946 "
               "0018'",
     "checks": [{"type": "json_schema", "schema": CONTACT_SCHEMA},
                {"type": "contains", "text": "dana.w@example.org"}]},
    {"id": "sentiment-json", "system": JSON_ONLY,
     "prompt": "Classify the sentiment of: 'The update broke my exports and support never replied.'",
     "checks": [{"type": "json_schema", "schema": SENTIMENT_SCHEMA}, {"type": "contains", "text": "negative"}]},
    {"id": "list-json", "system": JSON_ONLY,
     "prompt": "Give the primary colours of light as {\"colours\": [...]} in lower case.",
     "checks": [{"type": "json"}, {"type": "contains", "text": "green"}]},
    {"id": "date-iso",
     "prompt": "Write the date 'the fourth of March 2025' in ISO 8601 (YYYY-MM-DD). Answer with the date only.",
     "checks": [{"type": "regex", "pattern": "^\\s*2025-03-04\\s*$"}], "max_tokens": 16},
    {"id": "order-code",
     "prompt": "Our order codes are two capital letters, a dash and five digits. Write the code for region 'NL' and "
               "number 314. Pad the number with zeros. Answer with the code only.",
     "checks": [{"type": "regex", "pattern": "^\\s*NL-00314\\s*$"}], "max_tokens": 16},
    {"id": "sum-exact", "prompt": "What is 17 + 25? Answer with the number only.",
     "checks": [{"type": "exact", "text": "42"}], "max_tokens": 8},
    {"id": "percent-exact", "prompt": "What is 15% of 80? Answer with the number only.",
     "checks": [{"type": "exact", "text": "12"}], "max_tokens": 8},
    {"id": "capital", "prompt": "What is the capital of Australia? One word.",
     "checks": [{"type": "contains", "text": "Canberra"}], "max_tokens": 16},
    {"id": "unit", "prompt": "How many millilitres are in 2.5 litres? Answer with the number only.",
     "checks": [{"type": "regex", "pattern": "^\\s*2,?500\\s*$"}], "max_tokens": 16},
    {"id": "yes-no", "prompt": "Is 97 a prime number? Answer yes or no.",
     "checks": [{"type": "regex", "pattern": "^\\s*yes\\b", "flags": "i"}], "max_tokens": 8},
    {"id": "chat-follow-up", "messages": [
        {"role": "user", "content": "Remember the code word: heron."},
        {"role": "assistant", "content": "Noted: heron."},
        {"role": "user", "content": "What was the code word? One word."}],
     "checks": [{"type": "contains", "text": "heron"}], "max_tokens": 16},
]


def starter_jsonl():
    return "\n".join(json.dumps(case) for case in CASES) + "\n"
