"""Attacks on the webhook sender: reaching the server's own network (every private form of an
address, DNS rebinding), tying up a process (a slow receiver), exhausting memory (a huge answer),
and URLs that used to break the sender (an invalid port)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from recoverydash.alerts import transports
from recoverydash.alerts.delivery import deliver, process_flips
from recoverydash.alerts.models import Alert, AlertFlip, Delivery, WebhookEndpoint
from recoverydash.alerts.transports import (
    TransportError,
    address_refusal,
    check_address,
    resolve_endpoint,
)
from recoverydash.runs.models import Run

from .conftest import answer_ok, huge, trickle

pytestmark = pytest.mark.django_db

PRIVATE_FORMS = {
    # IPv4
    "127.0.0.1": "a loopback address",
    "127.255.0.9": "a loopback address",
    "10.1.2.3": "a private address",
    "172.16.0.1": "a private address",
    "192.168.1.1": "a private address",
    "169.254.169.254": "a link-local address",
    "0.0.0.0": "the unspecified address",
    "100.64.0.1": "an address that is not globally reachable",
    "198.18.0.1": "a private address",
    "192.0.0.8": "an IETF protocol address (192.0.0.0/24)",
    "224.0.0.1": "a multicast address",
    "240.0.0.1": "a reserved address",
    "255.255.255.255": "a reserved address",
    # IPv6
    "::1": "a loopback address",
    "::": "the unspecified address",
    "fe80::1": "a link-local address",
    "fc00::1": "a private address",
    "fd12:3456::1": "a private address",
    "fec0::1": "a site-local address",
    "ff02::1": "a multicast address",
    "100::1": "a reserved address",
    "2001:db8::1": "a private address",
    # IPv6 forms that carry an IPv4 address
    "::ffff:127.0.0.1": "an IPv4-mapped form of 127.0.0.1, a loopback address",
    "::ffff:10.0.0.1": "an IPv4-mapped form of 10.0.0.1, a private address",
    "::7f00:1": "an IPv4-compatible form of 127.0.0.1 (deprecated, never routed)",
    "::8.8.8.8": "an IPv4-compatible form of 8.8.8.8 (deprecated, never routed)",
    "64:ff9b::7f00:1": "a NAT64 form of 127.0.0.1, a loopback address",
    "64:ff9b::a9fe:a9fe": "a NAT64 form of 169.254.169.254, a link-local address",
    "64:ff9b:1::7f00:1": "a local-use NAT64 address",
    "2002:7f00:1::": "a 6to4 form of 127.0.0.1, a loopback address",
    "2002:c0a8:101::1": "a 6to4 form of 192.168.1.1, a private address",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "a Teredo address",
}

PUBLIC_FORMS = ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "2a00:1450:4001:80b::200e",
                "::ffff:93.184.216.34", "64:ff9b::5db8:d822", "2002:5db8:d822::1"]


@pytest.mark.parametrize("address", sorted(PRIVATE_FORMS))
def test_it_refuses_every_private_form_of_an_address(address):
    assert address_refusal(ipaddress.ip_address(address)) == PRIVATE_FORMS[address]


@pytest.mark.parametrize("address", PUBLIC_FORMS)
def test_it_lets_public_addresses_and_their_nat64_and_6to4_forms_through(address):
    assert address_refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("url", ["http://[::7f00:1]/x", "http://[::ffff:127.0.0.1]/x",
                                 "http://[64:ff9b::7f00:1]/x", "http://[2002:7f00:1::]/x",
                                 "http://2130706433/x", "http://0x7f.1/x", "http://0/x",
                                 "http://[::1]:8000/x", "https://127.1/x"])
def test_a_url_naming_loopback_in_any_spelling_is_refused_for_good(url, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(TransportError) as info:
        check_address(url)
    assert info.value.permanent
    assert "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE=true" in info.value.message


def stub_resolver(monkeypatch, *answers):
    """The attacker's resolver for names under example.test: the n-th lookup answers
    ``answers[n]`` (the last one repeats); returns the list of names looked up."""
    calls = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if not str(host).endswith(".example.test"):
            return real(host, port, *args, **kwargs)
        calls.append(host)
        addresses = answers[min(len(calls), len(answers)) - 1]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in addresses]

    monkeypatch.setattr(transports.socket, "getaddrinfo", getaddrinfo)
    return calls


def test_a_name_with_one_private_answer_among_public_ones_is_refused(monkeypatch, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    stub_resolver(monkeypatch, ["93.184.216.34", "10.0.0.7"])
    with pytest.raises(TransportError) as info:
        check_address("https://hooks.example.test/x")
    assert info.value.message.startswith(
        "hooks.example.test resolves to 10.0.0.7, a private address")


@pytest.fixture
def run(project):
    return Run.objects.create(project=project, run_id="llama-70b")


def fire(run):
    alert = Alert.objects.create(run=run, rule="restart_omission", subject="1",
                                 dedup_key=f"{run.run_id}:restart_omission:1",
                                 severity="critical", summary="Attempt 1 skipped 48 positions")
    AlertFlip.objects.create(alert=alert, new_state="firing", reason="test")
    [pk] = process_flips()
    return pk


def test_dns_rebinding_connects_to_the_checked_address_not_the_second_answer(
        run, monkeypatch, settings, raw_receiver):
    """The attacker's name answers a public address to the check and loopback to the
    connection. The sender resolves once and connects to the public address it checked (the
    test's network stands in for it, so no packet leaves the machine); the name still goes in
    the Host header."""
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    receiver = raw_receiver(answer_ok)
    lookups = stub_resolver(monkeypatch, ["93.184.216.34"], ["127.0.0.1"])
    connected = []

    def connect(address, port, timeout, local_address, socket_options):
        connected.append((address, port))
        # stand-in for the public host: the local receiver plays it
        return transports.httpcore.SyncBackend().connect_tcp("127.0.0.1", receiver.port,
                                                             timeout=timeout)

    monkeypatch.setattr(transports, "_connect_tcp", connect)
    WebhookEndpoint.objects.create(project=run.project,
                                   url=f"http://rebind.example.test:{receiver.port}/hook")
    pk = fire(run)
    assert deliver(pk) == "delivered"
    assert lookups == ["rebind.example.test"]  # one lookup: the answer checked is the one used
    assert connected == [("93.184.216.34", receiver.port)]
    [head] = receiver.requests
    assert f"Host: rebind.example.test:{receiver.port}".encode() in head


def test_dns_rebinding_to_loopback_at_check_time_sends_nothing(run, monkeypatch, settings,
                                                               raw_receiver):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    receiver = raw_receiver(answer_ok)
    stub_resolver(monkeypatch, ["127.0.0.1"])
    WebhookEndpoint.objects.create(project=run.project,
                                   url=f"http://rebind.example.test:{receiver.port}/hook")
    pk = fire(run)
    assert deliver(pk) == "failed"
    assert receiver.requests == []
    assert "rebind.example.test resolves to 127.0.0.1, a loopback address" in \
        Delivery.objects.get(pk=pk).last_error


def test_a_slow_receiver_gets_the_time_budget_and_no_more(run, settings, raw_receiver):
    """Each byte of the answer comes quickly (0.1 s apart), so no per-read timeout fires; the
    delivery's total budget (1 s here) ends it long before the receiver's 20 s are up."""
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S = 1.0
    receiver = raw_receiver(trickle(20.0))
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    pk = fire(run)
    assert deliver(pk) == "pending"  # a timeout may pass: retried later
    delivery = Delivery.objects.get(pk=pk)
    assert delivery.last_error.startswith("no complete answer within 1 s")
    assert receiver.sent < 100  # ~10 bytes per second for about a second, of 10,000 offered


def test_a_huge_answer_is_read_up_to_the_cap_only(run, settings, raw_receiver):
    """The receiver announces 4 GiB and can send 256 MiB: the sender reads 4 KiB (the cap here)
    and closes; what the receiver got rid of before the close is only what socket buffers
    hold."""
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    settings.RECOVERYDASH_WEBHOOK_MAX_RESPONSE_BYTES = 4096
    receiver = raw_receiver(huge(256 * 1024 * 1024))
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    pk = fire(run)
    assert deliver(pk) == "pending"
    delivery = Delivery.objects.get(pk=pk)
    assert delivery.last_status_code == 500
    assert delivery.last_error == "HTTP 500: " + "x" * 300
    assert receiver.sent < 32 * 1024 * 1024


def test_a_2xx_answer_with_a_huge_body_is_delivered_without_reading_it(run, settings,
                                                                       raw_receiver):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    receiver = raw_receiver(huge(256 * 1024 * 1024, b"200 OK"))
    WebhookEndpoint.objects.create(project=run.project, url=receiver.url)
    pk = fire(run)
    assert deliver(pk) == "delivered"
    assert receiver.sent < 32 * 1024 * 1024


@pytest.mark.parametrize("url", ["http://hooks.example.test:99999/x",
                                 "http://hooks.example.test:0/x"])
def test_a_stored_url_with_an_invalid_port_fails_its_delivery_for_good(run, url):
    WebhookEndpoint.objects.create(project=run.project, url=url)
    pk = fire(run)
    assert deliver(pk) == "failed"
    assert "port must be 1-65535" in Delivery.objects.get(pk=pk).last_error


def test_the_connection_is_refused_for_a_host_other_than_the_checked_one():
    endpoint = resolve_endpoint("http://127.0.0.1:9/x", allow_private=True)
    backend = transports._PinnedBackend(endpoint, deadline=float("inf"))
    with pytest.raises(transports.httpcore.ConnectError):
        backend.connect_tcp("10.0.0.1", 9)


def test_send_test_returns_at_once_while_the_receiver_is_slow(member_client, project, settings,
                                                              raw_receiver, monkeypatch):
    """16 clicks on "Send test" against a slow receiver used to hold 16 web processes. The
    view now only queues the test: the receiver has seen nothing when the answer comes back,
    the page says the test waits for a worker and refreshes itself; the worker's part then
    ends within the budget and the page shows the failure."""
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S = 1.0
    receiver = raw_receiver(trickle(20.0))
    queued = []
    monkeypatch.setattr("recoverydash.runs.queue.enqueue",
                        lambda name, *args, **kwargs: queued.append((name, args)) or True)
    endpoint = WebhookEndpoint.objects.create(project=project, url=receiver.url)
    page_url = f"/projects/{project.pk}/"

    response = member_client.post(f"{page_url}webhooks/{endpoint.pk}/test/")
    assert response.status_code == 302
    assert receiver.requests == []  # the web process sent nothing
    endpoint.refresh_from_db()
    assert endpoint.test_status == "pending" and endpoint.test_webhook_id.startswith("msg_")
    page = member_client.get(page_url).content.decode()
    assert "waiting for a worker" in page and f'data-live="{page_url}"' in page
    [(name, args)] = queued
    assert name == "workers.tasks.send_test_webhook"
    assert args == (endpoint.pk, endpoint.test_webhook_id)

    from recoverydash.alerts.delivery import send_test

    assert send_test(*args) == "failed"  # the worker's part
    assert len(receiver.requests) == 1
    endpoint.refresh_from_db()
    assert endpoint.test_message == "no complete answer within 1 s (ReadTimeout)"
    fragment = member_client.get(page_url + "?fragment=live").content.decode()
    assert "✖ failed</span> no complete answer within 1 s" in fragment


def test_a_newer_send_test_supersedes_an_older_one(member_client, project, monkeypatch,
                                                   settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    queued = []
    monkeypatch.setattr("recoverydash.runs.queue.enqueue",
                        lambda name, *args, **kwargs: queued.append(args) or True)
    endpoint = WebhookEndpoint.objects.create(project=project, url="http://127.0.0.1:9/x")
    for _ in range(2):
        member_client.post(f"/projects/{project.pk}/webhooks/{endpoint.pk}/test/")
    from recoverydash.alerts.delivery import send_test

    assert send_test(*queued[0]) == "pending"  # stale: not sent, the newer one still waits


def test_a_send_test_that_cannot_be_queued_fails_at_once(member_client, project, monkeypatch):
    monkeypatch.setattr("recoverydash.runs.queue.enqueue", lambda *args, **kwargs: False)
    endpoint = WebhookEndpoint.objects.create(project=project, url="https://hooks.example.org/x")
    member_client.post(f"/projects/{project.pk}/webhooks/{endpoint.pk}/test/")
    endpoint.refresh_from_db()
    assert endpoint.test_status == "failed"
    assert endpoint.test_message == "the test could not be queued: the task broker does not answer"


@pytest.mark.parametrize("url, error", [
    ("http://127.0.0.1:8000/hook", "127.0.0.1 is a loopback address: webhooks go to public "
                                   "addresses only; set RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE=true "
                                   "to allow private ones"),
    ("http://[::ffff:169.254.169.254]/latest/meta-data",
     "::ffff:169.254.169.254 is an IPv4-mapped form of 169.254.169.254, a link-local address"),
    ("http://hooks.example.org:99999/x", "webhook URL port must be 1-65535, got 99999"),
    ("ftp://hooks.example.org/x", "webhook URL must be http(s)://host/..., got "
                                  "'ftp://hooks.example.org/x'"),
])
def test_a_url_the_guard_refuses_is_refused_when_saved(member_client, project, settings, url,
                                                       error):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    response = member_client.post(f"/projects/{project.pk}/webhooks/",
                                  {"url": url, "kind": "standard", "min_severity": "info"})
    assert response.status_code == 200
    from django.utils.html import escape

    assert escape(error) in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_name_that_does_not_resolve_now_is_saved_with_a_warning(member_client, project,
                                                                  monkeypatch, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False

    def no_dns(host, port, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(transports.socket, "getaddrinfo", no_dns)
    response = member_client.post(f"/projects/{project.pk}/webhooks/",
                                  {"url": "https://hooks.example.org/x", "kind": "standard",
                                   "min_severity": "info"}, follow=True)
    assert WebhookEndpoint.objects.filter(url="https://hooks.example.org/x").exists()
    assert "cannot resolve hooks.example.org" in response.content.decode()
    assert "deliveries fail until it resolves" in response.content.decode()
