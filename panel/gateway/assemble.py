"""A non-streamed answer put together from the events of a stream.

The gateway asks every channel for a stream, also when its client asked for one JSON answer, because an engine such
as vLLM sends the headers of a non-streamed answer only once the whole answer is ready: the first-byte and idle time
budgets could not tell a long answer from a hang. The events are joined back into the chat.completion or
text_completion object the channel would have sent (content, reasoning, tool calls, log probabilities, finish reason,
usage from the final usage event)."""

HEAD_FIELDS = ("id", "object", "created", "model", "system_fingerprint", "service_tier")


def _join_logprobs(old, new):
    if not isinstance(new, dict):
        return old
    if not isinstance(old, dict):
        return {name: list(value) if isinstance(value, list) else value for name, value in new.items()}
    for name, value in new.items():
        if isinstance(value, list) and isinstance(old.get(name), list):
            old[name].extend(value)
        elif value is not None:
            old[name] = value
    return old


class Assembly:
    """Feed it every event of a stream (`add`), then take the answer (`answer`)."""

    def __init__(self):
        self.head = {}
        self.choices = {}
        self.usage = None

    def add(self, event):
        for name in HEAD_FIELDS:
            if name in event and name not in self.head:
                self.head[name] = event[name]
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            if isinstance(choice, dict):
                self._add_choice(choice)

    def _add_choice(self, choice):
        index = choice.get("index", 0)
        slot = self.choices.setdefault(index, {"index": index, "text": [], "content": [], "reasoning": [],
                                               "role": None, "tools": {}, "logprobs": None, "finish_reason": None,
                                               "extra": {}})
        if isinstance(choice.get("text"), str):
            slot["text"].append(choice["text"])
        delta = choice.get("delta")
        if isinstance(delta, dict):
            slot["role"] = slot["role"] or delta.get("role")
            if isinstance(delta.get("content"), str):
                slot["content"].append(delta["content"])
            reasoning = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(reasoning, str):
                slot["reasoning"].append(reasoning)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._add_tool_call(slot["tools"], call)
        slot["logprobs"] = _join_logprobs(slot["logprobs"], choice.get("logprobs"))
        if choice.get("finish_reason") is not None:
            slot["finish_reason"] = choice["finish_reason"]
        if choice.get("stop_reason") is not None:
            slot["extra"]["stop_reason"] = choice["stop_reason"]

    @staticmethod
    def _add_tool_call(tools, call):
        tool = tools.setdefault(call.get("index", len(tools)), {"id": None, "type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
        tool["id"] = tool["id"] or call.get("id")
        tool["type"] = call.get("type") or tool["type"]
        function = call.get("function") or {}
        if isinstance(function.get("name"), str):
            tool["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            tool["function"]["arguments"] += function["arguments"]

    def answer(self, *, chat):
        head = dict(self.head)
        head["object"] = "chat.completion" if chat else "text_completion"
        choices = []
        for index in sorted(self.choices):
            slot = self.choices[index]
            choice = {"index": index}
            if chat:
                message = {"role": slot["role"] or "assistant",
                           "content": "".join(slot["content"]) if slot["content"] or not slot["tools"] else None}
                if slot["reasoning"]:
                    message["reasoning_content"] = "".join(slot["reasoning"])
                if slot["tools"]:
                    message["tool_calls"] = [slot["tools"][key] for key in sorted(slot["tools"])]
                choice["message"] = message
            else:
                choice["text"] = "".join(slot["text"])
            choice.update(logprobs=slot["logprobs"], finish_reason=slot["finish_reason"], **slot["extra"])
            choices.append(choice)
        answer = {**head, "choices": choices}
        if self.usage is not None:
            answer["usage"] = self.usage
        return answer
