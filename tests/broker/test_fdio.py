"""write_all: the whole buffer or an OSError, through a real pipe that accepts short writes."""

from __future__ import annotations

import os
import threading

import pytest

from bounded_query.broker.fdio import write_all


def _drain(fd: int, out: bytearray) -> None:
    while chunk := os.read(fd, 7919):
        out.extend(chunk)


def test_a_full_nonblocking_pipe_is_retried_until_every_byte_is_through():
    data = os.urandom(1 << 20)  # 16 times the pipe's capacity: many short writes
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    received = bytearray()
    reader = threading.Thread(target=_drain, args=(read_fd, received))
    reader.start()
    try:
        write_all(write_fd, data, retry_blocking=True)
    finally:
        os.close(write_fd)
        reader.join(timeout=30)
        os.close(read_fd)
    assert bytes(received) == data


def test_without_retry_a_full_pipe_raises_instead_of_dropping_silently():
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        with pytest.raises(BlockingIOError):
            write_all(write_fd, b"x" * (1 << 20))
    finally:
        os.close(write_fd)
        os.close(read_fd)


def test_a_closed_reader_is_an_oserror():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        with pytest.raises(BrokenPipeError):
            write_all(write_fd, b"lost")
    finally:
        os.close(write_fd)
