from django import forms

from panel.usage.tags import RULE, TagError, tag_clean

TEAM = "team"
TAG = "tag"


class BudgetForm(forms.Form):
    target = forms.ChoiceField(label="Budget of")
    tag = forms.CharField(label="Tag", required=False, max_length=200,
                          help_text="For a tag's budget: the requests that carry this tag (the x-tokenwise-tags "
                                    "header or metadata.tags).")
    money_per_month = forms.DecimalField(label="Money per month", required=False, min_value=0, max_digits=14,
                                         decimal_places=2,
                                         help_text="In the channels' price currency. Blank: no limit.")
    tokens_per_month = forms.IntegerField(label="Tokens per month", required=False, min_value=0,
                                          max_value=10**15, help_text="Prompt and completion tokens. Blank: no limit.")

    def __init__(self, *args, keys, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys = {str(key.pk): key for key in keys}
        self.fields["target"].choices = ([(TEAM, "The whole team")]
                                         + [(pk, f"Key {key}") for pk, key in self.keys.items()]
                                         + [(TAG, "A tag (name it below)")])

    def clean(self):
        data = super().clean()
        target = data.get("target")
        data["key"] = self.keys.get(target) if target not in (TEAM, TAG) else None
        raw = (data.get("tag") or "").strip()
        data["tag"] = ""
        if target == TAG:
            if not raw:
                self.add_error("tag", f"Name the tag: {RULE}.")
            else:
                try:
                    data["tag"] = tag_clean(raw)
                except TagError as error:
                    self.add_error("tag", f"{error}.")
        elif raw:
            self.add_error("tag", "A tag is named only for a tag's budget: choose \"A tag\" above, or leave it blank.")
        return data
