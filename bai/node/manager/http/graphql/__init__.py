"""The GraphQL API (`POST /admin/gql`): Backend.AI 23.09's schema, as far as bai has the data.

`limits` bounds a request before it runs, `base` holds what the domains share (scalars, the request's
context, privilege, paged lists with `filter` / `order` in `minilang`), and each domain has a module
(`sessions`, `agents`, `images`, `keypairs`, `users`, `storage`) composed in `schema`. The HTTP
handler is `bai/node/manager/http/graphql_route.py`.
"""
