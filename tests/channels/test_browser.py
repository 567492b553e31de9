"""In Chromium: add a TaoToken channel from the preset, test it against a local fake provider (a refused key is
diagnosed, the right key passes), refuse a "Bearer" key, import the seeds' settings.json and edit a route."""

from playwright.sync_api import expect

from panel.channels.models import Channel
from tests.support.browser import screenshot, sign_in
from tests.support.credential_env import bind_credential_env
from tests.support.environment import FIXTURES
from tests.support.fake_provider import GOOD_KEY, FakeProvider

SEED_B = (FIXTURES / "seed_settings_b.json").read_text()


def test_it_adds_tests_and_imports_channels(page, live_server, team_setup, monkeypatch):
    provider = FakeProvider()
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-revoked-key-00000000")
    bind_credential_env(monkeypatch, "TAOTOKEN_API_KEY", "https://taotoken.net", provider.url)  # the operator's
    try:
        sign_in(page, live_server.url, "alice", "pw-alice-123")
        page.click("nav.sidebar >> text=Channels")
        expect(page.locator(".empty h2")).to_have_text("No channels yet")
        screenshot(page, "channels-empty")

        page.click("text=Add a TaoToken channel")
        expect(page.locator("#id_base_url")).to_have_value("https://taotoken.net/api/v1")
        expect(page.locator("#id_credential_env")).to_have_value("TAOTOKEN_API_KEY")
        expect(page.locator("#id_credential_kind")).to_have_value("env")
        expect(page.locator("#id_apis")).to_have_value("chat_only")  # TaoToken: chat, Responses translated
        screenshot(page, "channel-form-taotoken")
        # Point the preset at the local fake provider instead of the real TaoToken.
        page.fill("#id_base_url", provider.url + "/v1")
        page.fill("#id_price_input_per_million", "0.55")
        page.fill("#id_price_output_per_million", "2.2")
        page.fill("#id_price_cached_per_million", "0.11")
        page.click("button:has-text('Save channel')")
        expect(page.locator("h1")).to_have_text("taotoken")
        expect(page.locator("table.kv")).to_contain_text("${TAOTOKEN_API_KEY}")
        expect(page.locator("table.kv")).to_contain_text("OpenAI chat")

        page.click("button:has-text('Test')")
        expect(page.locator(".test-result .pill").first).to_have_text("Failed")
        expect(page.locator(".diagnosis")).to_contain_text("401 Unauthorized")
        expect(page.locator(".diagnosis")).to_contain_text("missing, wrong or revoked")
        expect(page.locator("body")).not_to_contain_text("sk-revoked-key-00000000")
        screenshot(page, "channel-test-401")

        page.click("text=Edit")
        page.select_option("#id_credential_kind", "stored")
        page.fill("#id_api_key", "Bearer " + GOOD_KEY)
        page.click("button:has-text('Save channel')")
        expect(page.locator(".field-error")).to_contain_text("without \"Bearer\"")
        screenshot(page, "channel-form-bearer-refused")
        page.fill("#id_api_key", GOOD_KEY)
        page.click("button:has-text('Save channel')")
        expect(page.locator("table.kv")).to_contain_text("••••1234")
        page.click("button:has-text('Test')")
        expect(page.locator(".test-result .pill").first).to_have_text("Passed")
        expect(page.locator(".test-steps")).to_contain_text("lists 2 models")
        expect(page.locator("body")).not_to_contain_text(GOOD_KEY)
        screenshot(page, "channel-test-passed")

        page.click(".crumbs >> text=Channels")
        page.click("text=Import settings.json")
        page.fill("#id_text", SEED_B)
        screenshot(page, "settings-import")
        page.click("button:has-text('Import')")
        expect(page.locator(".message.success")).to_contain_text("Imported settings.json (format B)")
        expect(page.locator(".message.warning")).to_contain_text("has no /v1")
        expect(page.locator("table").first).to_contain_text("local_awq")
        expect(page.locator("table").nth(1)).to_contain_text("Qwen/Qwen2.5-7B-Instruct-AWQ")
        screenshot(page, "channels-list")

        page.click("text=Import settings.json")
        page.fill("#id_text", SEED_B.replace("/v1\"", "/v1/v1\"", 1))
        page.click("button:has-text('Import')")
        expect(page.locator(".message.error")).to_contain_text("$.channels.local_awq.base_url")
        screenshot(page, "settings-import-error")

        page.goto(f"{live_server.url}/channels/")
        page.locator("table").nth(1).locator("a:has-text('Edit')").first.click()
        expect(page.locator("h1")).to_contain_text("Route")
        page.check(f"#id_use_{Channel.objects.get(name='taotoken').pk}")
        page.select_option("#id_strategy", "local_first")
        screenshot(page, "route-form")
        page.click("button:has-text('Save route')")
        expect(page.locator(".chain").first).to_contain_text("taotoken")
    finally:
        provider.close()


def test_the_taotoken_preset_keeps_a_typed_key_and_asks_for_prices(page, live_server, team_setup):
    """The preset once set "Environment variable", dropped a key typed into "API key" without a word and saved
    prices of 0."""
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/new/?preset=taotoken")
    expect(page.locator("#id_credential_kind")).to_have_value("env")
    for name in ("input", "output", "cached"):
        expect(page.locator(f"#id_price_{name}_per_million")).to_have_value("")
    page.fill("#id_api_key", GOOD_KEY)
    page.click("button:has-text('Save channel')")
    # All three prices are asked for at once; nothing is saved yet.
    expect(page.locator(".field-error", has_text="Enter the provider's price per million tokens")).to_have_count(3)
    assert not Channel.objects.exists()
    page.fill("#id_api_key", GOOD_KEY)  # a password field is not sent back
    page.fill("#id_price_input_per_million", "0.55")
    page.fill("#id_price_output_per_million", "2.2")
    page.fill("#id_price_cached_per_million", "0.11")
    page.click("button:has-text('Save channel')")
    expect(page.locator("h1")).to_have_text("taotoken")
    expect(page.locator(".message.info")).to_contain_text("you typed an API key: it is stored here")
    channel = Channel.objects.get(name="taotoken")
    assert (channel.credential_kind, channel.credential_last4, channel.misconfigured) == ("stored", GOOD_KEY[-4:], "")
    assert str(channel.price_output_per_million.normalize()) == "2.2"
    screenshot(page, "channel-taotoken-key-kept")


def test_the_channel_form_shows_the_pool_section_for_a_vllm_pool_only(page, live_server, team_setup):
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/new/")
    pool = page.locator('section[data-when-field="kind"]')
    expect(pool).to_contain_text("vLLM pool")
    for kind, shown in (("remote", False), ("pool", True), ("local", False), ("pool", True)):
        page.select_option("#id_kind", kind)
        if shown:
            expect(page.locator("#id_scrape_urls")).to_be_visible()
        else:
            expect(page.locator("#id_scrape_urls")).to_be_hidden()
    page.fill("#id_name", "gpu-pool")
    screenshot(page, "channel-form-pool")
