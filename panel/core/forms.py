"""What every page's form does with a service's refusal."""


def errors_into(form, error):
    """A service's ValidationError onto `form`: each problem under its field, or above the form for a field the form
    does not have (and for a ValidationError that names no field)."""
    by_field = error.message_dict if hasattr(error, "error_dict") else {None: error.messages}
    for field, problems in by_field.items():
        form.add_error(field if field in form.fields else None, problems)
