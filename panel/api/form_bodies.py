"""The pages' forms are the API's validation too: a request body's schema is read from a form's fields (so the
OpenAPI schema says what the page accepts), and the body is then validated by that same form, so every rule the
page applies (and nothing else) applies to the API."""
import datetime
from decimal import Decimal
from typing import Literal, Optional

from django import forms
from django.core.files.uploadedfile import SimpleUploadedFile
from django.forms.models import model_to_dict
from ninja import Schema
from pydantic import Field, create_model

from panel.api.errors import form_invalid


def _choice_values(field):
    values = []
    for value, label in field.choices:
        if isinstance(label, (list, tuple)):
            values += [inner for inner, _ in label]
        elif value != "":
            values.append(value)
    return values


def _annotation(field):
    if isinstance(field, forms.BooleanField):
        return bool, {}
    if isinstance(field, forms.ModelChoiceField):
        return int, {"ge": 1, "le": 2**53}
    if isinstance(field, forms.ChoiceField):
        values = _choice_values(field)
        if values and all(isinstance(value, int) and not isinstance(value, bool) for value in values):
            return Literal[tuple(values)], {}  # a number field with a fixed set (block_size: 8, 16, 32 …)
        if not values and isinstance(field, forms.TypedChoiceField) and field.coerce is int:
            return int, {}
        values = [str(value) for value in values]
        return (Literal[tuple(values)] if values else str), {}
    limits = {}
    if getattr(field, "min_value", None) is not None:
        limits["ge"] = field.min_value
    if getattr(field, "max_value", None) is not None:
        limits["le"] = field.max_value
    if isinstance(field, (forms.FloatField, forms.DecimalField)):  # before IntegerField: they subclass it
        return (Decimal if isinstance(field, forms.DecimalField) else float), {"allow_inf_nan": False, **limits}
    if isinstance(field, forms.IntegerField):
        return int, limits
    if isinstance(field, forms.DateTimeField):
        return datetime.datetime, {}
    if isinstance(field, forms.CharField):
        return str, ({"max_length": field.max_length} if field.max_length else {})
    return str, {}


def _has_default(form_class, name, field):
    """The page fills this field in for you: an initial value, or the model field's default."""
    if field.initial is not None:
        return True
    model = getattr(getattr(form_class, "_meta", None), "model", None)
    if model is None:
        return False
    try:
        return model._meta.get_field(name).has_default()
    except Exception:  # a form field that is no model field
        return False


def schema_from_form(form_class, name, *, exclude=(), partial=False, extra=None):
    """A request body schema with one property per field of `form_class` (file fields left out: the API takes their
    text). A field is required when the page requires it and gives it no default. `partial`: every property
    optional (PATCH). `extra`: more {name: (type, default)}."""
    fields = {}
    for field_name, field in form_class.base_fields.items():
        if field_name in exclude or isinstance(field, forms.FileField):
            continue
        annotation, limits = _annotation(field)
        description = str(field.help_text or field.label or "")
        if field.required and not partial and not _has_default(form_class, field_name, field):
            fields[field_name] = (annotation, Field(..., description=description, **limits))
        else:
            fields[field_name] = (Optional[annotation], Field(None, description=description, **limits))
    fields.update(extra or {})
    return create_model(name, __base__=Schema, **fields)


def _plain(value):
    if hasattr(value, "pk"):
        return value.pk
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def form_data(form, body, *, instance=None):
    """The data a page's form would receive: each field's initial value (or the instance's current one), then what
    the body sets. None means blank."""
    data = {name: _plain(form.get_initial_for_field(field, name)) for name, field in form.fields.items()}
    if instance is not None:
        data.update({name: _plain(value) for name, value in model_to_dict(instance).items() if name in form.fields})
    given = body.dict(exclude_unset=True) if hasattr(body, "dict") else dict(body)
    data.update(given)
    for name, field in form.fields.items():
        value = data.get(name)
        if value is None:
            data.pop(name, None)  # a blank field (a BooleanField's blank is False)
        elif isinstance(field, forms.DateTimeField) and isinstance(value, datetime.datetime):
            data[name] = value.isoformat()
        elif isinstance(value, bool) and not isinstance(field, forms.BooleanField):
            data[name] = str(value)
    return data


def text_file(name, text):
    """A text the API received in place of a page's file upload, as that upload (so the form checks it the same)."""
    return SimpleUploadedFile(name, text.encode("utf-8") if isinstance(text, str) else text)


def validated(form_class, body, *, instance=None, files=None, **form_kwargs):
    """The bound form, valid, or Invalid with its errors (nothing saved). `files`: {field: text_file(...)}."""
    given = {"instance": instance} if instance is not None else {}
    blank = form_class(**form_kwargs, **given)
    form = form_class(data=form_data(blank, body, instance=instance), files=files or None, **form_kwargs, **given)
    if not form.is_valid():
        raise form_invalid(form)
    return form
