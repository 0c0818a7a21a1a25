// The API's JSON shapes as they travel (snake_case, api/openapi.yaml).
// Internal: the SDK's public types are camelCase.
export {};
