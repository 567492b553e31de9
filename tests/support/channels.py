"""Channel test helpers: a remote channel with a stored key (KEY), a deployment of a tiny model in a given state,
and a deployment's state changed as its worker would change it."""
from panel.channels.models import ChannelKind, CredentialKind
from panel.channels.services import channel_create

KEY = "sk-live-0123456789abcdefWXYZ"


def remote(team, **changes):
    fields = dict(name="taotoken", kind=ChannelKind.REMOTE, base_url="https://taotoken.net/api/v1",
                  model_id="qwen2.5-7b-instruct", credential_kind=CredentialKind.STORED)
    fields.update(changes)
    api_key = fields.pop("api_key", KEY)
    return channel_create(team=team, user=None, api_key=api_key, **fields)


def make_deployment(team, user, profile_name, *, served="tiny-served", state="pending", port=8123, **fields):
    from panel.registry.models import RegisteredModel
    from panel.serving.models import Deployment, ServingProfile

    model, _ = RegisteredModel.objects.get_or_create(
        team=team, name="tiny", defaults=dict(path="/models/tiny", architecture="Qwen2ForCausalLM",
                                              model_type="qwen2", parameter_count=1, linear_parameter_count=1,
                                              num_layers=1, num_attention_heads=4, num_kv_heads=2, hidden_size=256,
                                              head_dim=64, max_position_embeddings=4096, dtype="bfloat16",
                                              size_bytes=1))
    profile, _ = ServingProfile.objects.get_or_create(team=team, name=profile_name,
                                                     defaults={"model": model, "created_by": user})
    return Deployment.objects.create(team=team, profile=profile, created_by=user, state=state,
                                     served_model_name=served, port=port, base_url=f"http://127.0.0.1:{port}/v1",
                                     **fields)


def set_state(deployment, state, **fields):
    from panel.serving.models import Deployment

    Deployment.objects.filter(pk=deployment.pk).update(state=state, **fields)
    deployment.refresh_from_db()
