from django import forms

TEAM = "team"


class BudgetForm(forms.Form):
    target = forms.ChoiceField(label="Budget of")
    money_per_month = forms.DecimalField(label="Money per month", required=False, min_value=0, max_digits=14,
                                         decimal_places=2,
                                         help_text="In the channels' price currency. Blank: no limit.")
    tokens_per_month = forms.IntegerField(label="Tokens per month", required=False, min_value=0,
                                          max_value=10**15, help_text="Prompt and completion tokens. Blank: no limit.")

    def __init__(self, *args, keys, **kwargs):
        super().__init__(*args, **kwargs)
        self.keys = {str(key.pk): key for key in keys}
        self.fields["target"].choices = [(TEAM, "The whole team")] + [(pk, f"Key {key}") for pk, key in
                                                                      self.keys.items()]

    def clean(self):
        data = super().clean()
        data["key"] = self.keys.get(data.get("target")) if data.get("target") != TEAM else None
        return data
