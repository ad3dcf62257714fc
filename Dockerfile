# fencer's manager image, for machines with a container runtime. `make image`
# builds the same image (one static binary, UID 65532, nothing else) as a
# tarball without one.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/
RUN CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags="-s -w" -o /fencer ./cmd/fencer

FROM scratch
COPY --from=build /fencer /fencer
USER 65532:65532
ENTRYPOINT ["/fencer"]
