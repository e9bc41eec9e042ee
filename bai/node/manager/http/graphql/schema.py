"""The schema: Backend.AI 23.09's `Queries` and `Mutations`, as far as bai has the data, one module
per domain (code-first, with graphql-core's types)."""

from __future__ import annotations

from graphql import GraphQLObjectType, GraphQLSchema

from bai.node.manager.http.graphql import agent_fields as agents
from bai.node.manager.http.graphql import image_fields as images
from bai.node.manager.http.graphql import keypair_fields as keypairs
from bai.node.manager.http.graphql import network_fields as networks
from bai.node.manager.http.graphql import preset_fields as presets
from bai.node.manager.http.graphql import session_fields as sessions
from bai.node.manager.http.graphql import storage_fields as storage
from bai.node.manager.http.graphql import user_fields as users

QUERY_FIELDS = {
    **sessions.QUERIES,
    **agents.QUERIES,
    **images.QUERIES,
    **keypairs.QUERIES,
    **users.QUERIES,
    **storage.QUERIES,
    **networks.QUERIES,
    **presets.QUERIES,
}
MUTATION_FIELDS = {
    **keypairs.MUTATIONS,
    **images.MUTATIONS,
    **users.MUTATIONS,
    **presets.MUTATIONS,
    **sessions.MUTATIONS,
}

SCHEMA = GraphQLSchema(
    query=GraphQLObjectType("Queries", lambda: QUERY_FIELDS),
    mutation=GraphQLObjectType("Mutations", lambda: MUTATION_FIELDS),
)
