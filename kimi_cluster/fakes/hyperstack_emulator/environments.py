"""Environments and keypairs: create, list, get and delete, with the API's names, conflicts and paging."""

from __future__ import annotations

from typing import Any

from .answers import environment_record, keypair_record
from .catalog import REGIONS
from .payloads import fingerprint, validate
from .query import page, q
from .state import ApiError, Cloud, now_iso

Query = dict[str, list[str]]


def create_environment(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    body = validate("CreateEnvironment", body)
    if body["region"] not in {r["name"] for r in REGIONS}:
        raise ApiError(400, "bad_request", f"region {body['region']} is not valid")
    if cloud.find_env(body["name"]):
        raise ApiError(409, "already_exist", f"Environment with name {body['name']} already exists")
    env = {"id": cloud.next_id(), "name": body["name"], "region": body["region"], "created_at": now_iso()}
    cloud.state.environments[env["id"]] = env
    return {"status": True, "message": "Environment created successfully", "environment": environment_record(env)}


def list_environments(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    search = (q(query, "search") or "").lower()
    envs = [environment_record(e) for e in cloud.state.environments.values()
            if not search or search in e["name"].lower() or search in e["region"].lower()
            or search == str(e["id"])]
    listed, number, size = page(envs, query, "pageSize", default_size=None)
    return {"status": True, "message": "Success", "environments": listed, "page": number, "page_size": size,
            "count": len(envs)}


def _get_environment(cloud: Cloud, env_id: str) -> dict[str, Any]:
    env = cloud.state.environments.get(int(env_id))
    if env is None:
        raise ApiError(404, "not_found", f"Environment with id {env_id} does not exists")
    return env


def get_environment(cloud: Cloud, query: Query, body: Any, env_id: str) -> dict[str, Any]:
    return {"status": True, "message": "Success", "environment": environment_record(_get_environment(cloud, env_id))}


def delete_environment(cloud: Cloud, query: Query, body: Any, env_id: str) -> dict[str, Any]:
    env = _get_environment(cloud, env_id)
    children = [v for v in cloud.state.vms.values() if v.environment_id == env["id"]] + \
               [k for k in cloud.state.keypairs.values() if k["environment_id"] == env["id"]]
    if children:
        raise ApiError(405, "not_allowed", f"Environment {env['name']} has attached child resources "
                                           f"({len(children)}); delete VMs and keypairs first")
    del cloud.state.environments[env["id"]]
    return {"status": True, "message": "Environment deleted successfully"}


def import_keypair(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    body = validate("ImportKeypairPayload", body)
    env = cloud.find_env(body["environment_name"])
    if env is None:
        raise ApiError(404, "not_found", f"Environment {body['environment_name']} does not exists")
    if any(k["name"] == body["name"] and k["environment_id"] == env["id"] for k in cloud.state.keypairs.values()):
        raise ApiError(409, "already_exist", f"Keypair with name {body['name']} already exists")
    kp = {"id": cloud.next_id(), "name": body["name"], "environment_id": env["id"],
          "public_key": body["public_key"], "fingerprint": fingerprint(body["public_key"]), "created_at": now_iso()}
    cloud.state.keypairs[kp["id"]] = kp
    return {"status": True, "message": "Keypair imported successfully", "keypair": keypair_record(cloud, kp)}


def list_keypairs(cloud: Cloud, query: Query, body: Any) -> dict[str, Any]:
    search = (q(query, "search") or "").lower()
    kps = [keypair_record(cloud, k) for k in cloud.state.keypairs.values()
           if not search or search in k["name"].lower()]
    listed, number, size = page(kps, query, "pageSize", default_size=None)
    return {"status": True, "message": "Success", "keypairs": listed, "page": number, "page_size": size,
            "count": len(kps)}


def delete_keypair(cloud: Cloud, query: Query, body: Any, kp_id: str) -> dict[str, Any]:
    if cloud.state.keypairs.pop(int(kp_id), None) is None:
        raise ApiError(404, "not_found", f"Keypair with id {kp_id} does not exists")
    return {"status": True, "message": "Keypair deleted successfully"}
