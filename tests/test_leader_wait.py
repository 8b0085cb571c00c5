"""Waiting for the lease: it ends when this process leads, when it is told to stop (SIGTERM/SIGINT
set a flag, so the hand-over is never cut by an exception), or when the campaign died."""

from __future__ import annotations

import threading

import pytest

from triton_operator.kube.leader import Leadership, wait_to_lead


def events() -> tuple[Leadership, threading.Event, threading.Event]:
    return Leadership("triton-system", "triton-operator", "me"), threading.Event(), threading.Event()


def test_it_returns_true_once_this_process_leads():
    leadership, leading, stopping = events()
    threading.Timer(0.3, leading.set).start()
    assert wait_to_lead(leadership, leading, stopping) is True


def test_a_stop_while_waiting_returns_false_without_raising():
    leadership, leading, stopping = events()
    threading.Timer(0.3, stopping.set).start()
    assert wait_to_lead(leadership, leading, stopping) is False


def test_the_lease_won_in_the_instant_of_a_stop_still_counts_as_leading():
    """The caller then runs kopf with the stop flag set: kopf stops at once and the lease is released."""
    leadership, leading, stopping = events()
    leading.set()
    stopping.set()
    assert wait_to_lead(leadership, leading, stopping) is True


def test_a_campaign_that_died_before_leading_is_an_error():
    leadership, leading, stopping = events()
    leadership.lost.set()
    with pytest.raises(RuntimeError, match="leader election stopped before this process could lead"):
        wait_to_lead(leadership, leading, stopping)
