"""The endpoint picker's version stamps: what its Dockerfile sets, from what ``go mod download -json`` says."""

from __future__ import annotations

from mmfleet_lab.cluster.build import _epp_ldflags

_VERSION = "sigs.k8s.io/gateway-api-inference-extension/version"


def test_the_commit_is_the_one_the_proxy_gives_for_the_tag() -> None:
    info = {"Version": "v1.5.0", "Origin": {"VCS": "git", "Hash": "df9f8909", "Ref": "refs/tags/v1.5.0"}}
    assert _epp_ldflags(info) == f"-s -w -X {_VERSION}.CommitSHA=df9f8909 -X {_VERSION}.BuildRef=v1.5.0"


def test_a_proxy_that_gives_no_origin_stamps_the_dockerfiles_default() -> None:
    # A proxy whose .info carries no Origin (older or private ones): the build must still go through.
    assert f"-X {_VERSION}.CommitSHA=unknown " in _epp_ldflags({"Version": "v1.5.0"})
