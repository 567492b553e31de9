"""An evaluation set from a route's traffic samples: each kept request becomes a case whose reference is the answer the
client got (an `agrees` check on the recorded answer) and, when the request asked for JSON and got it, a `json`
check. The cases go through the same JSONL reading as any upload (evaluations/sets.py), so a set made this way holds
to every bound a pasted one does; a sample that cannot be a case (too many messages, a message too long, no user
message at the end) is skipped and counted."""
import json

from django.db import transaction

from panel.core import safejson
from panel.evaluations.checks import MAX_ANSWER_CHARS
from panel.evaluations.models import EvalSet
from panel.evaluations.services import eval_set_create, eval_set_revise
from panel.evaluations.sets import MAX_CASES, MAX_CONTENT_CHARS, MAX_MESSAGES, MAX_TOKENS_LIMIT
from panel.usage.samples import sample_content

MIN_SIMILARITY = 0.5  # the candidate's answer shares half the words of the recorded one (word F1, checks.py)


def sample_case(sample, content):
    """The case of one sample, or (None, why not)."""
    messages = content["messages"]
    answer = (content.get("answer") or "").strip()
    if not answer:
        return None, "no answer text"
    if not messages or len(messages) > MAX_MESSAGES:
        return None, f"more than {MAX_MESSAGES} messages"
    if messages[-1]["role"] != "user":
        return None, "the conversation does not end with a user message"
    if any(len(message["content"]) > MAX_CONTENT_CHARS for message in messages):
        return None, f"a message over {MAX_CONTENT_CHARS:,} characters"
    checks = [{"type": "agrees", "answer": answer[:MAX_ANSWER_CHARS], "min_similarity": MIN_SIMILARITY}]
    if content.get("json_requested") and _parses(answer):
        checks.insert(0, {"type": "json"})
    # Room for an answer as long as the recorded one (about 4 characters a token) and then some.
    max_tokens = min(MAX_TOKENS_LIMIT, max(256, len(answer) // 2))
    return {"id": f"sample-{sample.pk}", "messages": messages, "checks": checks, "max_tokens": max_tokens}, ""


def _parses(text):
    try:
        safejson.loads(text)
    except (ValueError, TypeError):
        return False
    return True


def samples_jsonl(route):
    """(the JSONL of the route's newest samples as cases, {reason: how many were skipped})."""
    lines, skipped = [], {}
    for sample in route.samples.all()[:MAX_CASES]:
        case, why = sample_case(sample, sample_content(sample))
        if case is None:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            lines.append(json.dumps(case, ensure_ascii=False))
    return "\n".join(lines), skipped


@transaction.atomic
def eval_set_from_samples(*, route, user, name, request=None):
    """A new set named `name` from the route's samples, or a new version of the team's set of that name; either way
    the set is marked as made of samples, readable only by those who may read samples (models.sets_readable).
    Returns (the set, how many cases, {reason: skipped}); ValidationError, saving nothing, as for any upload."""
    text, skipped = samples_jsonl(route)
    existing = EvalSet.objects.filter(team=route.team, name=(name or "").strip()).first()
    note = f"from {route.model_name}'s traffic samples"
    if existing is not None:
        version = eval_set_revise(eval_set=existing, user=user, text=text, note=note, request=request)
        EvalSet.objects.filter(pk=existing.pk).update(from_samples=True)
        return existing, len(version.cases), skipped
    eval_set = eval_set_create(team=route.team, user=user, name=name, text=text, request=request,
                               description=f"Made {note}: each case's reference is the answer the client got.")
    EvalSet.objects.filter(pk=eval_set.pk).update(from_samples=True)
    return eval_set, len(eval_set.current().cases), skipped
