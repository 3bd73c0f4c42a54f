import csv,sys,collections
rows=list(csv.reader(open(sys.argv[1])))
hdr=None
data=[]
for r in rows:
    if r and r[0]=="ID": hdr=r; continue
    if hdr and len(r)==len(hdr): data.append(dict(zip(hdr,r)))
print(len(data),"kernel rows")
# last decode step: the last N kernels; group by name
agg=collections.OrderedDict()
n=int(sys.argv[2]) if len(sys.argv)>2 else 600
sub=data[-n:]
tot=0
for d in sub:
    name=d["Kernel Name"][:70]
    v=float(d["Metric Value"].replace(",",""))
    unit=d["Metric Unit"]
    us=v/1000 if unit in ("nsecond","ns") else (v if unit in ("usecond","us") else v*1000)
    a=agg.setdefault(name,[0,0]); a[0]+=us; a[1]+=1; tot+=us
for k,(t,c) in sorted(agg.items(),key=lambda x:-x[1][0]):
    print(f"{t:9.1f} us {c:5d} x {t/c:7.2f} us  {k}")
print("total kernel time us", tot)
