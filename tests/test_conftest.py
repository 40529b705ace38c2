"""The shared test helpers of tests/conftest.py."""

from tests.conftest import free_port


def test_free_port_never_hands_out_a_port_twice():
    """A Ray head asks for its GCS, client-server and dashboard ports before it binds any of
    them; the kernel reuses closed ephemeral ports often enough that 500 plain bind-to-0 draws
    repeat one every time this was tried (a CI run lost the multi-node tests to such a pair)."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports), sorted(p for p in set(ports) if ports.count(p) > 1)
