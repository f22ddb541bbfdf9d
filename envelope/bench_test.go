package envelope

import "testing"

func BenchmarkMarshalRequest(b *testing.B) {
	req := fullRequest()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Marshal(&req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	req := fullRequest()
	data := mustMarshal(b, &req)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRequest(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalEnvelope(b *testing.B) {
	env := fullEnvelope()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Marshal(&env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeEnvelope(b *testing.B) {
	env := fullEnvelope()
	data := mustMarshal(b, &env)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeEnvelope(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInputHash(b *testing.B) {
	in := mustRawFromJSON(b, `{"orderId":"o-42","amount":900,"currency":"EUR","lines":[{"sku":"A-1","qty":2,"price":12.5},{"sku":"B-7","qty":1,"price":375}],"note":"refund requested by customer"}`)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := InputHash(in); err != nil {
			b.Fatal(err)
		}
	}
}
