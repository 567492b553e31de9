"""Attack test: an admin of team A who set an account's password through A's invite link cannot get into team B
when B invites that email; the account joins B only by accepting, signed in, and nobody else can accept for it."""
import re

from django.contrib.auth import get_user_model
from django.urls import reverse

from panel.accounts.models import Invitation, Membership
from panel.accounts.services import membership_add


def test_an_invite_to_an_existing_email_binds_nothing_until_that_account_accepts(client, team_setup,
                                                                                django_user_model):
    alice, bob = team_setup["alice"], team_setup["bob"]  # owners of team A and team B
    client.force_login(alice)
    answer = client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "member"})
    link = re.search(r'id="setup-link">([^<]+)<', answer.content.decode()).group(1)
    client.logout()
    client.post(link, {"new_password1": "alice-knows-this-9", "new_password2": "alice-knows-this-9"})
    dana = get_user_model().objects.get(email="dana@example.com")

    client.force_login(bob)
    assert client.post(reverse("member_invite"), {"who": "dana@example.com", "role": "admin"}).status_code == 302
    assert not Membership.objects.filter(team=team_setup["team_b"], user=dana).exists()
    invitation = Invitation.objects.get(team=team_setup["team_b"], user=dana)

    stranger = django_user_model.objects.create_user("eve", password="pw-eve-12345")
    membership_add(team=team_setup["team_a"], user=stranger)
    client.force_login(stranger)  # someone else cannot accept it for dana
    client.post(reverse("invitation_accept", args=[invitation.pk]))
    assert not Membership.objects.filter(team=team_setup["team_b"]).exclude(user=bob).exists()

    client.force_login(dana)
    assert "Accept" in client.get(reverse("account")).content.decode()
    client.post(reverse("invitation_accept", args=[invitation.pk]))
    assert Membership.objects.get(team=team_setup["team_b"], user=dana).role == "admin"
    assert not Invitation.objects.exists()
